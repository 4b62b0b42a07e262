/*
 * Form: a whole P4_16 v1model program carrying a Camus-style ITCH spec: #include <core.p4> and
 * <v1model.p4>, typedefs and consts, headers including ARP (split into a fixed part and an
 * IPv4-over-Ethernet part), a headers struct whose instances are `mold_hdr`, `mold_msg`,
 * `itch_msg_type`, `add_order`, @pragma query_field... lines WITH widths, and a parser whose
 * `start` state only transitions, with an ARP state that selects on a tuple of four fields.
 * Then the controls a spec front end must skip: checksum verification, an ingress with tables,
 * an egress, checksum computation, a deparser and `V1Switch(...) main;`.
 *
 * Messages: Nasdaq TotalView-ITCH Add Order ('A' = 0x41) in MoldUDP64 on UDP port 1234.
 * Written for subc's test corpus in the style of Camus; not a copy of any Camus file.
 */
#include <core.p4>
#include <v1model.p4>

typedef bit<48> macAddr_t;
typedef bit<32> ip4Addr_t;
typedef bit<9>  egressSpec_t;

const bit<16> TYPE_IPV4 = 0x800;
const bit<16> TYPE_ARP  = 0x806;
const bit<8>  PROTO_UDP = 17;
const bit<16> MOLD_PORT = 1234;
const bit<8>  ITCH_ADD_ORDER = 0x41;
const bit<16> ARP_HTYPE_ETHERNET = 0x0001;
const bit<16> ARP_PTYPE_IPV4 = 0x0800;
const bit<8>  ARP_HLEN_ETHERNET = 6;
const bit<8>  ARP_PLEN_IPV4 = 4;
const bit<16> ARP_OPER_REPLY = 2;

header ethernet_t {
    macAddr_t dstAddr;
    macAddr_t srcAddr;
    bit<16>   etherType;
}

header arp_t {
    bit<16> htype;
    bit<16> ptype;
    bit<8>  hlen;
    bit<8>  plen;
    bit<16> oper;
}

header arp_ipv4_t {
    macAddr_t sha;
    ip4Addr_t spa;
    macAddr_t tha;
    ip4Addr_t tpa;
}

header ipv4_t {
    bit<4>    version;
    bit<4>    ihl;
    bit<8>    diffserv;
    bit<16>   totalLen;
    bit<16>   identification;
    bit<3>    flags;
    bit<13>   fragOffset;
    bit<8>    ttl;
    bit<8>    protocol;
    bit<16>   hdrChecksum;
    ip4Addr_t srcAddr;
    ip4Addr_t dstAddr;
}

header udp_t {
    bit<16> srcPort;
    bit<16> dstPort;
    bit<16> len;
    bit<16> checksum;
}

header moldudp_hdr_t {
    bit<80> session;
    bit<64> seq;
    bit<16> msg_cnt;
}

header moldudp_msg_t {
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
    arp_t            arp;
    arp_ipv4_t       arp_ipv4;
    ipv4_t           ipv4;
    udp_t            udp;
    moldudp_hdr_t    mold_hdr;
    moldudp_msg_t    mold_msg;
    itch_msg_type_t  itch_msg_type;
    itch_add_order_t add_order;
}

struct metadata {
    bit<16> query_state;
}

@pragma query_field(add_order.shares, 32)
@pragma query_field(add_order.price, 32)
@pragma query_field_exact(add_order.stock, 64)
@pragma query_field_exact(add_order.buy_sell_indicator, 8)
@pragma query_field_lpm(ipv4.dstAddr, 32)

parser MyParser(packet_in packet,
                out headers hdr,
                inout metadata meta,
                inout standard_metadata_t standard_metadata) {

    state start {
        transition parse_ethernet;
    }

    state parse_ethernet {
        packet.extract(hdr.ethernet);
        transition select(hdr.ethernet.etherType) {
            TYPE_IPV4: parse_ipv4;
            TYPE_ARP: parse_arp;
            default: accept;
        }
    }

    state parse_arp {
        packet.extract(hdr.arp);
        transition select(hdr.arp.htype, hdr.arp.ptype, hdr.arp.hlen, hdr.arp.plen) {
            (1, 0x0800, 6, 4) : parse_arp_ipv4;
            default : accept;
        }
    }

    state parse_arp_ipv4 {
        packet.extract(hdr.arp_ipv4);
        transition accept;
    }

    state parse_ipv4 {
        packet.extract(hdr.ipv4);
        transition select(hdr.ipv4.protocol) {
            PROTO_UDP: parse_udp;
            default: accept;
        }
    }

    state parse_udp {
        packet.extract(hdr.udp);
        transition select(hdr.udp.dstPort) {
            MOLD_PORT: parse_moldudp;
            default: accept;
        }
    }

    state parse_moldudp {
        packet.extract(hdr.mold_hdr);
        packet.extract(hdr.mold_msg);
        packet.extract(hdr.itch_msg_type);
        transition select(hdr.itch_msg_type.msg_type) {
            ITCH_ADD_ORDER: parse_add_order;
            default: accept;
        }
    }

    state parse_add_order {
        packet.extract(hdr.add_order);
        transition accept;
    }
}

control MyVerifyChecksum(inout headers hdr, inout metadata meta) {
    apply {
        verify_checksum(hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.totalLen,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.fragOffset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.srcAddr, hdr.ipv4.dstAddr },
            hdr.ipv4.hdrChecksum, HashAlgorithm.csum16);
    }
}

control MyIngress(inout headers hdr,
                  inout metadata meta,
                  inout standard_metadata_t standard_metadata) {
    action drop() {
        mark_to_drop(standard_metadata);
    }

    action set_egress(egressSpec_t port) {
        standard_metadata.egress_spec = port;
    }

    action set_mgid(bit<16> mgid) {
        standard_metadata.mcast_grp = mgid;
    }

    action arp_reply(macAddr_t mac) {
        hdr.arp.oper = ARP_OPER_REPLY;
        hdr.arp_ipv4.tha = hdr.arp_ipv4.sha;
        hdr.arp_ipv4.sha = mac;
        ip4Addr_t tmp = hdr.arp_ipv4.spa;
        hdr.arp_ipv4.spa = hdr.arp_ipv4.tpa;
        hdr.arp_ipv4.tpa = tmp;
        hdr.ethernet.dstAddr = hdr.ethernet.srcAddr;
        hdr.ethernet.srcAddr = mac;
        standard_metadata.egress_spec = standard_metadata.ingress_port;
    }

    table arp_responder {
        key = { hdr.arp_ipv4.tpa: exact; }
        actions = { arp_reply; NoAction; }
        size = 64;
        default_action = NoAction();
    }

    table forward {
        key = {
            meta.query_state: exact;
            hdr.add_order.isValid(): exact;
        }
        actions = { set_egress; set_mgid; drop; }
        size = 1024;
        default_action = drop();
    }

    apply {
        if (hdr.arp.isValid() && hdr.arp_ipv4.isValid()) {
            arp_responder.apply();
        } else if (hdr.add_order.isValid()) {
            forward.apply();
        }
    }
}

control MyEgress(inout headers hdr,
                 inout metadata meta,
                 inout standard_metadata_t standard_metadata) {
    action rewrite(macAddr_t mac, ip4Addr_t ip) {
        hdr.ethernet.dstAddr = mac;
        hdr.ipv4.dstAddr = ip;
        hdr.udp.checksum = 0;
    }

    table send_frame {
        key = { standard_metadata.egress_port: exact; }
        actions = { rewrite; NoAction; }
        size = 512;
        default_action = NoAction();
    }

    apply {
        send_frame.apply();
    }
}

control MyComputeChecksum(inout headers hdr, inout metadata meta) {
    apply {
        update_checksum(hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.diffserv, hdr.ipv4.totalLen,
              hdr.ipv4.identification, hdr.ipv4.flags, hdr.ipv4.fragOffset, hdr.ipv4.ttl,
              hdr.ipv4.protocol, hdr.ipv4.srcAddr, hdr.ipv4.dstAddr },
            hdr.ipv4.hdrChecksum, HashAlgorithm.csum16);
    }
}

control MyDeparser(packet_out packet, in headers hdr) {
    apply {
        packet.emit(hdr.ethernet);
        packet.emit(hdr.arp);
        packet.emit(hdr.arp_ipv4);
        packet.emit(hdr.ipv4);
        packet.emit(hdr.udp);
        packet.emit(hdr.mold_hdr);
        packet.emit(hdr.mold_msg);
        packet.emit(hdr.itch_msg_type);
        packet.emit(hdr.add_order);
    }
}

V1Switch(
    MyParser(),
    MyVerifyChecksum(),
    MyIngress(),
    MyEgress(),
    MyComputeChecksum(),
    MyDeparser()
) main;
