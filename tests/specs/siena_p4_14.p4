/*
 * Form: a P4_14 spec for a non-ITCH message: Siena-style publications (ten 32-bit attributes)
 * in MoldUDP64 on UDP port 5555, selected by a 16-bit `kind` field.  Unlike the Camus ITCH
 * spec, `start` extracts Ethernet itself (no transition-only start state), selects name the
 * field as `inst.f` and as `latest.f`, constants are #define'd in hex and in decimal, a case is
 * written with a mask (`value mask m`), and the pragmas mix forms: with and without widths,
 * and `query_field_range` (Camus's explicit spelling of range matching) next to
 * `query_field`, `query_field_exact` and `query_field_lpm`.
 * Written for subc's test corpus; not a copy of any Camus file.
 */

#define ETHERTYPE_IPV4 0x0800
#define IPPROTO_UDP 17
#define SIENA_PORT 5555
#define SIENA_KIND_PUBLICATION 0x5E01
#define SIENA_KIND_HEARTBEAT 0x5E02

header_type ethernet_t {
    fields {
        dstAddr : 48;
        srcAddr : 48;
        etherType : 16;
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

header_type mold_t {
    fields {
        session : 80;
        seq : 64;
        msg_cnt : 16;
    }
}

header_type mold_block_t {
    fields {
        msg_len : 16;
    }
}

header_type siena_kind_t {
    fields {
        kind : 16;
    }
}

header_type siena_t {
    fields {
        a0 : 32;
        a1 : 32;
        a2 : 32;
        a3 : 32;
        a4 : 32;
        a5 : 32;
        a6 : 32;
        a7 : 32;
        a8 : 32;
        a9 : 32;
    }
}

header ethernet_t ethernet;
header ipv4_t ipv4;
header udp_t udp;
header mold_t mold;
header mold_block_t mold_block;
header siena_kind_t siena_kind;
header siena_t siena;

@pragma query_field(siena.a0)
@pragma query_field(siena.a1, 32)
@pragma query_field_range(siena.a2)
@pragma query_field_range(siena.a3, 32)
@pragma query_field_exact(siena.a4)
@pragma query_field_exact(siena.a5, 32)
@pragma query_field_lpm(siena.a6, 32)
@pragma query_field(siena.a7)
@pragma query_field(siena.a8, 32)
@pragma query_field_range(siena.a9)
@pragma query_default_action(drop)

parser start {
    extract(ethernet);
    return select(ethernet.etherType) {
        ETHERTYPE_IPV4 : parse_ipv4;
        default : ingress;
    }
}

parser parse_ipv4 {
    extract(ipv4);
    return select(latest.protocol) {
        IPPROTO_UDP : parse_udp;
        default : ingress;
    }
}

parser parse_udp {
    extract(udp);
    return select(latest.dstPort) {
        SIENA_PORT : parse_mold;
        default : ingress;
    }
}

parser parse_mold {
    extract(mold);
    extract(mold_block);
    extract(siena_kind);
    return select(siena_kind.kind) {
        SIENA_KIND_PUBLICATION mask 0xFFFF : parse_siena;
        SIENA_KIND_HEARTBEAT : ingress;
        default : ingress;
    }
}

parser parse_siena {
    extract(siena);
    return ingress;
}

action forward(port) {
    modify_field(standard_metadata.egress_spec, port);
}

action _drop() {
    drop();
}

table publications {
    reads {
        siena.a0 : range;
        siena.a4 : exact;
    }
    actions {
        forward;
        _drop;
    }
    size : 4096;
}

control ingress {
    if (valid(siena)) {
        apply(publications);
    }
}
