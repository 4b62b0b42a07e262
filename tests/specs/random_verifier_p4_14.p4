/* A random message-format spec (tests/spec_model.py), P4_14 form. */

#define IP_PROTO_UDP 0x11

@pragma query_field_exact(price_2.price_1, 32)
@pragma query_field_exact(price_2.bits)
@pragma query_field_exact(price_2.order_ref_1)
@pragma query_default_action(drop)

header_type ethernet_t {
    fields {
        dstAddr : 48;
        srcAddr : 48;
        etherType : 16;
    }
}

header_type price_t {
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

header_type a_t {
    fields {
        srcPort : 16;
        dstPort : 16;
        length_ : 16;
        checksum : 16;
    }
}

header_type price_1_t {
    fields {
        session : 80;
        seq : 64;
        msg_cnt : 16;
    }
}

header_type gQYzdW8fX0_t {
    fields {
        msg_len : 16;
    }
}

header_type itch_msg_type_t {
    fields {
        price : 8;
    }
}

header_type price_2_t {
    fields {
        order_ref : 32;
        bits : 1;
        price : 1;
        mpid : 33;
        price_1 : 32;
        order_ref_1 : 5;
    }
}

header_type a1_t {
    fields {
        price : 18;
        cPuDVR : 23;
        wj9H : 7;
    }
}

header ethernet_t ethernet;
header price_t price;
header a_t a;
header price_1_t price_1;
header gQYzdW8fX0_t gQYzdW8fX0;
header itch_msg_type_t itch_msg_type;
header price_2_t price_2;
header a1_t a1;

parser start {
    return parse_o;
}

parser parse_o {
    extract(ethernet);
    return select(ethernet.etherType) {
        2048 : parse_lo;
        default : ingress;
    }
}

parser parse_lo {
    extract(price);
    return select(latest.protocol) {
        IP_PROTO_UDP : parse_kW;
        default : ingress;
    }
}

parser parse_kW {
    extract(a);
    return select(latest.dstPort) {
        0x2E : parse_kvZmdKhvMX;
        default : ingress;
    }
}

parser parse_kvZmdKhvMX {
    extract(price_1);
    extract(gQYzdW8fX0);
    extract(itch_msg_type);
    return select(latest.price) {
        2 : parse_f;
        default : ingress;
    }
}

parser parse_f {
    extract(price_2);
    extract(a1);
    return ingress;
}

control ingress {
}
