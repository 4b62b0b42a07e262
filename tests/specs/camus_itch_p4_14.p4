/*
 * Form: Camus's P4_14 ITCH spec (the shape of the HotNets 2018 paper's spec files and of the
 * Camus repository): #define constants, header_type declarations, `header T inst;` and
 * `metadata T inst;` instances, @pragma query_field... lines WITHOUT widths placed before the
 * header instance they name, parser functions (`parser start { return parse_ethernet; }`,
 * select on `latest.f` and on `inst.f`, `return ingress;` to accept), and the rest of a P4_14
 * program that a spec front end must skip: field_list, field_list_calculation,
 * calculated_field, actions with modify_field(...), tables with reads/actions/size, and the
 * ingress and egress control blocks.
 *
 * Messages: Nasdaq TotalView-ITCH Add Order ('A' = 65) in MoldUDP64 on UDP port 1234.
 * Written for subc's test corpus in the style of Camus; not a copy of any Camus file.
 */

#define ETHERTYPE_IPV4 0x0800
#define ETHERTYPE_ARP  0x0806
#define IP_PROT_UDP    0x11
#define ITCH41_MSG_ADD_ORDER 65
#define ARP_OPER_REQUEST 1
#define ARP_OPER_REPLY   2
#define PORT_TABLE_SIZE  512

header_type intrinsic_metadata_t {
    fields {
        mcast_grp : 16;
        egress_rid : 16;
        lf_field_list : 32;
        resubmit_flag : 16;
        ingress_global_timestamp : 48;
    }
}

header_type ethernet_t {
    fields {
        dstAddr : 48;
        srcAddr : 48;
        etherType : 16;
    }
}

header_type arp_t {
    fields {
        htype : 16;
        ptype : 16;
        hlen : 8;
        plen : 8;
        oper : 16;
        senderHwAddr : 48;
        senderProtoAddr : 32;
        targetHwAddr : 48;
        targetProtoAddr : 32;
    }
}

header_type ipv4_t {
    fields {
        version : 4;
        ihl : 4;
        diffserv : 8;
        totalLen : 16;
        identification : 16;
        flags : 3;
        fragOffset : 13;
        ttl : 8;
        protocol : 8;
        hdrChecksum : 16;
        srcAddr : 32;
        dstAddr : 32;
    }
}

header_type udp_t {
    fields {
        srcPort : 16;
        dstPort : 16;
        length_ : 16;
        checksum : 16;
    }
}

header_type moldudp_hdr_t {
    fields {
        session : 80;
        seq : 64;
        msg_cnt : 16;
    }
}

header_type moldudp_msg_t {
    fields {
        msg_len : 16;
    }
}

header_type itch_msg_type_t {
    fields {
        msg_type : 8;
    }
}

header_type itch_add_order_t {
    fields {
        stock_locate : 16;
        tracking_number : 16;
        timestamp : 48;
        order_ref_number : 64;
        buy_sell_indicator : 8;
        shares : 32;
        stock : 64;
        price : 32;
    }
}

header_type routing_metadata_t {
    fields {
        mcast_grp : 16;
        egress_port : 9;
        query_state : 16;
    }
}

metadata intrinsic_metadata_t intrinsic_metadata;
header ethernet_t ethernet;
header arp_t arp;
header ipv4_t ipv4;
header udp_t udp;
header moldudp_hdr_t moldudp_hdr;
header moldudp_msg_t moldudp_msg;
header itch_msg_type_t itch_msg_type;

@pragma query_field(add_order.buy_sell_indicator)
@pragma query_field(add_order.price)
@pragma query_field(add_order.shares)
@pragma query_field_exact(add_order.stock)
header itch_add_order_t add_order;

metadata routing_metadata_t routing_metadata;

/* Checksums: a spec front end skips these declarations. */
field_list ipv4_checksum_list {
    ipv4.version;
    ipv4.ihl;
    ipv4.diffserv;
    ipv4.totalLen;
    ipv4.identification;
    ipv4.flags;
    ipv4.fragOffset;
    ipv4.ttl;
    ipv4.protocol;
    ipv4.srcAddr;
    ipv4.dstAddr;
}

field_list_calculation ipv4_checksum {
    input {
        ipv4_checksum_list;
    }
    algorithm : csum16;
    output_width : 16;
}

calculated_field ipv4.hdrChecksum {
    verify ipv4_checksum;
    update ipv4_checksum;
}

/* Parser */
parser start {
    return parse_ethernet;
}

parser parse_ethernet {
    extract(ethernet);
    return select(latest.etherType) {
        ETHERTYPE_IPV4 : parse_ipv4;
        ETHERTYPE_ARP : parse_arp;
        default: ingress;
    }
}

parser parse_arp {
    extract(arp);
    return select(latest.oper) {
        ARP_OPER_REQUEST : parse_arp_request;
        default : ingress;
    }
}

parser parse_arp_request {
    return ingress;
}

parser parse_ipv4 {
    extract(ipv4);
    return select(ipv4.protocol) {
        IP_PROT_UDP : parse_udp;
        default: ingress;
    }
}

parser parse_udp {
    extract(udp);
    return select(udp.dstPort) {
        1234: parse_moldudp;
        default: ingress;
    }
}

parser parse_moldudp {
    extract(moldudp_hdr);
    extract(moldudp_msg);
    extract(itch_msg_type);
    return select(latest.msg_type) {
        ITCH41_MSG_ADD_ORDER: parse_add_order;
        default: ingress;
    }
}

parser parse_add_order {
    extract(add_order);
    return ingress;
}

/* Actions, tables and controls: not part of the message format. */
action _nop() {
}

action _drop() {
    drop();
}

action set_egress_port(port) {
    modify_field(standard_metadata.egress_spec, port);
}

action set_mgid(mgid) {
    modify_field(intrinsic_metadata.mcast_grp, mgid);
    modify_field(routing_metadata.mcast_grp, mgid);
}

action arp_reply(mac) {
    modify_field(arp.oper, ARP_OPER_REPLY);
    modify_field(arp.targetHwAddr, arp.senderHwAddr);
    modify_field(arp.targetProtoAddr, arp.senderProtoAddr);
    modify_field(arp.senderHwAddr, mac);
    modify_field(ethernet.dstAddr, ethernet.srcAddr);
    modify_field(ethernet.srcAddr, mac);
    modify_field(standard_metadata.egress_spec, standard_metadata.ingress_port);
}

action rewrite_dst(mac, ip) {
    modify_field(ethernet.dstAddr, mac);
    modify_field(ipv4.dstAddr, ip);
    add_to_field(ipv4.ttl, -1);
}

table arp_responder {
    reads {
        arp.targetProtoAddr : exact;
    }
    actions {
        arp_reply;
        _nop;
    }
    size : 64;
}

table forward {
    reads {
        routing_metadata.query_state : exact;
        add_order : valid;
    }
    actions {
        set_egress_port;
        set_mgid;
        _drop;
    }
    size : 1024;
}

table send_frame {
    reads {
        standard_metadata.egress_port : exact;
    }
    actions {
        rewrite_dst;
        _nop;
    }
    size : PORT_TABLE_SIZE;
}

control ingress {
    if (valid(arp)) {
        apply(arp_responder);
    } else {
        if (valid(add_order)) {
            apply(forward);
        }
    }
}

control egress {
    apply(send_frame);
}
