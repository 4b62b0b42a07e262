/* Message-format spec for Nasdaq TotalView-ITCH 5.0 Add Order messages carried in
 * MoldUDP64 over UDP/IPv4/Ethernet (one message per packet is matched: the first).
 *
 * Field layout: Nasdaq TotalView-ITCH 5.0 specification, section 1.3.1 (Add Order, 'A')
 * and 1.3.2 (Add Order with MPID, 'F', whose first 36 bytes are the same);
 * MoldUDP64 Protocol Specification v1.00, section "Downstream packets".
 */
#include <core.p4>

const bit<16> TYPE_IPV4 = 0x0800;
const bit<8>  IP_PROTO_UDP = 17;
const bit<16> ITCH_UDP_PORT = 26400;
const bit<8>  ITCH_ADD_ORDER = 0x41;       // 'A'
const bit<8>  ITCH_ADD_ORDER_MPID = 0x46;  // 'F'

typedef bit<48> mac_addr_t;
typedef bit<32> ipv4_addr_t;

header ethernet_t {
    mac_addr_t dstAddr;
    mac_addr_t srcAddr;
    bit<16>    etherType;
}

header ipv4_t {
    bit<4>      version;
    bit<4>      ihl;
    bit<8>      diffserv;
    bit<16>     totalLen;
    bit<16>     identification;
    bit<3>      flags;
    bit<13>     fragOffset;
    bit<8>      ttl;
    bit<8>      protocol;
    bit<16>     hdrChecksum;
    ipv4_addr_t srcAddr;
    ipv4_addr_t dstAddr;
}

header udp_t {
    bit<16> srcPort;
    bit<16> dstPort;
    bit<16> length_;
    bit<16> checksum;
}

header moldudp64_t {
    bit<80> session;
    bit<64> seq;
    bit<16> msg_cnt;
}

header moldudp64_msg_t {
    bit<16> msg_len;
}

header itch_msg_type_t {
    bit<8> msg_type;
}

header itch_add_order_t {
    bit<16> stock_locate;
    bit<16> tracking_number;
    bit<48> timestamp;
    bit<64> order_ref_number;
    bit<8>  buy_sell_indicator;
    bit<32> shares;
    bit<64> stock;
    bit<32> price;
}

struct headers {
    ethernet_t       ethernet;
    ipv4_t           ipv4;
    udp_t            udp;
    moldudp64_t      mold;
    moldudp64_msg_t  mold_msg;
    itch_msg_type_t  itch;
    itch_add_order_t add_order;
}

struct metadata {
}

@pragma query_field(add_order.shares)
@pragma query_field(add_order.price)
@pragma query_field_scale(add_order.price, 4)
@pragma query_field_exact(add_order.stock)
@pragma query_field_alpha(add_order.stock)
@pragma query_field_exact(add_order.buy_sell_indicator)
@pragma query_field_alpha(add_order.buy_sell_indicator)
@pragma query_field_lpm(ipv4.dstAddr)
@pragma query_default_action(drop)

parser ItchParser(packet_in packet,
                  out headers hdr,
                  inout metadata meta,
                  inout standard_metadata_t standard_metadata) {
    state start {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            TYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        transition select(hdr.ipv4.protocol) {
            IP_PROTO_UDP: parse_udp;
            default: accept;
        }
    }

    state parse_udp {
        packet.extract(hdr.udp);
        transition select(hdr.udp.dstPort) {
            ITCH_UDP_PORT: parse_moldudp64;
            default: accept;
        }
    }

    state parse_moldudp64 {
        packet.extract(hdr.mold);
        packet.extract(hdr.mold_msg);
        packet.extract(hdr.itch);
        transition select(hdr.itch.msg_type) {
            ITCH_ADD_ORDER: parse_add_order;
            ITCH_ADD_ORDER_MPID: parse_add_order;
            default: accept;
        }
    }

    state parse_add_order {
        packet.extract(hdr.add_order);
        transition accept;
    }
}
