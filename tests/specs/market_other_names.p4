/*
 * Form: a P4_16 ITCH-like spec whose Add Order header names its fields differently from the
 * ITCH example (side, qty, symbol, px; instance `ao`), so nothing may assume ITCH names.  Two
 * message types select states that share a header: 'A' (0x41) extracts `ao`, 'F' (0x46)
 * extracts `ao` and then a 32-bit attribution header (`attribution.mpid`).  Constants are
 * written with width prefixes (8w0x41, 16w26400), a typedef names the price type, `start`
 * extracts Ethernet itself, and the pragmas have widths.
 * Written for subc's test corpus; not a copy of any Camus file.
 */
#include <core.p4>

typedef bit<32> price_t;

const bit<16> ETH_IPV4 = 16w0x0800;
const bit<8>  UDP_PROTO = 8w17;
const bit<16> FEED_PORT = 16w26400;
const bit<8>  MSG_ADD = 8w0x41;        // 'A'
const bit<8>  MSG_ADD_ATTRIB = 8w0x46; // 'F'

header eth_h {
    bit<48> dst;
    bit<48> src;
    bit<16> ethertype;
}

header ip4_h {
    bit<4>  version;
    bit<4>  ihl;
    bit<8>  tos;
    bit<16> total_len;
    bit<16> ident;
    bit<3>  flags;
    bit<13> frag_offset;
    bit<8>  ttl;
    bit<8>  proto;
    bit<16> checksum;
    bit<32> src;
    bit<32> dst;
}

header udp_h {
    bit<16> sport;
    bit<16> dport;
    bit<16> len;
    bit<16> csum;
}

header mold_h {
    bit<80> session;
    bit<64> sequence;
    bit<16> count_;
}

header block_h {
    bit<16> length_;
}

header msg_kind_h {
    bit<8> kind;
}

header add_h {
    bit<16> locate;
    bit<16> tracking;
    bit<48> ts;
    bit<64> ref;
    bit<8>  side;
    bit<32> qty;
    bit<64> symbol;
    price_t px;
}

header attribution_h {
    bit<32> mpid;
}

struct headers_t {
    eth_h         eth;
    ip4_h         ip;
    udp_h         l4;
    mold_h        mold;
    block_h       block;
    msg_kind_h    msg;
    add_h         ao;
    attribution_h attribution;
}

struct meta_t {
}

@pragma query_field_exact(ao.side, 8)
@pragma query_field(ao.qty, 32)
@pragma query_field_exact(ao.symbol, 64)
@pragma query_field(ao.px, 32)
@pragma query_field_scale(ao.px, 4)
@pragma query_field_exact(attribution.mpid, 32)

parser FeedParser(packet_in pkt,
                  out headers_t h,
                  inout meta_t m,
                  inout standard_metadata_t std) {
    state start {
        pkt.extract(h.eth);
        transition select(h.eth.ethertype) {
            ETH_IPV4: parse_ip;
            default: accept;
        }
    }

    state parse_ip {
        pkt.extract(h.ip);
        transition select(h.ip.proto) {
            UDP_PROTO: parse_l4;
            default: accept;
        }
    }

    state parse_l4 {
        pkt.extract(h.l4);
        transition select(h.l4.dport) {
            FEED_PORT: parse_mold;
            default: accept;
        }
    }

    state parse_mold {
        pkt.extract(h.mold);
        pkt.extract(h.block);
        pkt.extract(h.msg);
        transition select(h.msg.kind) {
            MSG_ADD: parse_add;
            MSG_ADD_ATTRIB: parse_add_attrib;
            default: accept;
        }
    }

    state parse_add {
        pkt.extract(h.ao);
        transition accept;
    }

    state parse_add_attrib {
        pkt.extract(h.ao);
        pkt.extract(h.attribution);
        transition accept;
    }
}
