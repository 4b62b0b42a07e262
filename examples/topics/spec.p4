/* Message-format spec for hierarchical topics (MQTT-style names such as market/nasdaq/AAPL) carried
 * as MoldUDP64 messages over UDP/IPv4/Ethernet, for `subc serve`'s REGISTER/SUB requests.
 *
 * A topic name's levels are labelled with numbers by the broker (REGISTER -> REGACK, as Tatarski et
 * al. label topic levels before the kernel sees them); a publisher writes the number of levels and
 * each level's label into the topic header, then the payload.  The data path matches only numbers:
 * a filter market/+/AAPL becomes `topic.levels == 3 and topic.l0 == L(market) and topic.l2 == L(AAPL)`.
 * The payload (never parsed by the data path: @pragma query_payload) is, by subc's topic client
 * convention, a 2-byte big-endian name length, the topic name in UTF-8, then the application's bytes.
 *
 * Framing: MoldUDP64 Protocol Specification v1.00, section "Downstream packets".
 */
#include <core.p4>

const bit<16> TYPE_IPV4 = 0x0800;
const bit<8>  IP_PROTO_UDP = 17;
const bit<16> TOPIC_UDP_PORT = 9300;
const bit<8>  MSG_TOPIC = 0x54;        // 'T': a topic message

typedef bit<48> mac_addr_t;
typedef bit<32> ipv4_addr_t;
typedef bit<32> label_t;

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

header msg_type_t {
    bit<8> msg_type;
}

/* A topic of up to 8 levels: `levels` of them are used, the labels of the others are 0. */
header topic_t {
    bit<8>  priority;   // set by the publisher (0 to 255); subscribers may filter on it (SUB ... WHERE)
    bit<8>  levels;
    label_t l0;
    label_t l1;
    label_t l2;
    label_t l3;
    label_t l4;
    label_t l5;
    label_t l6;
    label_t l7;
}

struct headers {
    ethernet_t      ethernet;
    ipv4_t          ipv4;
    udp_t           udp;
    moldudp64_t     mold;
    moldudp64_msg_t mold_msg;
    msg_type_t      msg;
    topic_t         topic;
}

struct metadata {
}

@pragma query_field_exact(topic.l0)
@pragma query_field_exact(topic.l1)
@pragma query_field_exact(topic.l2)
@pragma query_field_exact(topic.l3)
@pragma query_field_exact(topic.l4)
@pragma query_field_exact(topic.l5)
@pragma query_field_exact(topic.l6)
@pragma query_field_exact(topic.l7)
@pragma query_field(topic.levels)
@pragma query_field(topic.priority)
@pragma query_topic(topic.levels, topic.l0, topic.l1, topic.l2, topic.l3, topic.l4, topic.l5, topic.l6, topic.l7)
@pragma query_payload(topic)
@pragma query_default_action(drop)

parser TopicParser(packet_in packet,
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
            TOPIC_UDP_PORT: parse_moldudp64;
            default: accept;
        }
    }

    state parse_moldudp64 {
        packet.extract(hdr.mold);
        packet.extract(hdr.mold_msg);
        packet.extract(hdr.msg);
        transition select(hdr.msg.msg_type) {
            MSG_TOPIC: parse_topic;
            default: accept;
        }
    }

    state parse_topic {
        packet.extract(hdr.topic);
        transition accept;
    }
}
