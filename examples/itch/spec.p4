/* Message-format spec for Nasdaq TotalView-ITCH 5.0 carried in MoldUDP64 over UDP/IPv4/Ethernet.
 *
 * Every message type of ITCH 5.0 is parsed, so that this spec alone gives each type's fields and
 * length (subc decodes traces with it: a BinaryFILE whose length prefixes are 0 is walked with these
 * lengths, and a message whose length differs from its type's is reported, never decoded).  Rules
 * query the Add Order fields: 'A' and 'F' (Add Order with MPID attribution) both fill the
 * add_order header; 'F' then has its 4-byte attribution.
 *
 * Field layout: Nasdaq TotalView-ITCH 5.0 specification, section 1.3 (message formats: every
 * message starts with type, stock locate, tracking number and a 6-byte timestamp);
 * MoldUDP64 Protocol Specification v1.00, section "Downstream packets".
 */
#include <core.p4>

const bit<16> TYPE_IPV4 = 0x0800;
const bit<8>  IP_PROTO_UDP = 17;
const bit<16> ITCH_UDP_PORT = 26400;
const bit<8>  ITCH_ADD_ORDER = 0x41;       // 'A'
const bit<8>  ITCH_ADD_ORDER_MPID = 0x46;  // 'F'
const bit<8>  ITCH_SYSTEM_EVENT = 0x53;    // 'S'
const bit<8>  ITCH_STOCK_DIRECTORY = 0x52; // 'R'
const bit<8>  ITCH_TRADING_ACTION = 0x48;  // 'H'
const bit<8>  ITCH_REG_SHO = 0x59;         // 'Y'
const bit<8>  ITCH_MP_POSITION = 0x4C;     // 'L'
const bit<8>  ITCH_MWCB_DECLINE = 0x56;    // 'V'
const bit<8>  ITCH_MWCB_STATUS = 0x57;     // 'W'
const bit<8>  ITCH_IPO_QUOTING = 0x4B;     // 'K'
const bit<8>  ITCH_LULD_COLLAR = 0x4A;     // 'J'
const bit<8>  ITCH_OPERATIONAL_HALT = 0x68; // 'h'
const bit<8>  ITCH_EXECUTED = 0x45;        // 'E'
const bit<8>  ITCH_EXECUTED_PRICE = 0x43;  // 'C'
const bit<8>  ITCH_CANCEL = 0x58;          // 'X'
const bit<8>  ITCH_DELETE = 0x44;          // 'D'
const bit<8>  ITCH_REPLACE = 0x55;         // 'U'
const bit<8>  ITCH_TRADE = 0x50;           // 'P'
const bit<8>  ITCH_CROSS_TRADE = 0x51;     // 'Q'
const bit<8>  ITCH_BROKEN_TRADE = 0x42;    // 'B'
const bit<8>  ITCH_NOII = 0x49;            // 'I'
const bit<8>  ITCH_RPII = 0x4E;            // 'N'
const bit<8>  ITCH_DLCR = 0x4F;            // 'O'

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

header itch_mpid_t {
    bit<32> attribution;
}

/* The other message types: the common part (stock locate, tracking number, timestamp) and their
 * own fields, as in section 1.3 of the ITCH 5.0 specification. */
header itch_system_event_t {
    bit<16> stock_locate;
    bit<16> tracking_number;
    bit<48> timestamp;
    bit<8>  event_code;
}

header itch_stock_directory_t {
    bit<16> stock_locate;
    bit<16> tracking_number;
    bit<48> timestamp;
    bit<64> stock;
    bit<8>  market_category;
    bit<8>  financial_status;
    bit<32> round_lot_size;
    bit<8>  round_lots_only;
    bit<8>  issue_classification;
    bit<16> issue_subtype;
    bit<8>  authenticity;
    bit<8>  short_sale_threshold;
    bit<8>  ipo_flag;
    bit<8>  luld_price_tier;
    bit<8>  etp_flag;
    bit<32> etp_leverage_factor;
    bit<8>  inverse_indicator;
}

header itch_trading_action_t {
    bit<16> stock_locate;
    bit<16> tracking_number;
    bit<48> timestamp;
    bit<64> stock;
    bit<8>  trading_state;
    bit<8>  reserved;
    bit<32> reason;
}

header itch_reg_sho_t {
    bit<16> stock_locate;
    bit<16> tracking_number;
    bit<48> timestamp;
    bit<64> stock;
    bit<8>  reg_sho_action;
}

header itch_mp_position_t {
    bit<16> stock_locate;
    bit<16> tracking_number;
    bit<48> timestamp;
    bit<32> mpid;
    bit<64> stock;
    bit<8>  primary_market_maker;
    bit<8>  market_maker_mode;
    bit<8>  participant_state;
}

header itch_mwcb_decline_t {
    bit<16> stock_locate;
    bit<16> tracking_number;
    bit<48> timestamp;
    bit<64> level1;
    bit<64> level2;
    bit<64> level3;
}

header itch_mwcb_status_t {
    bit<16> stock_locate;
    bit<16> tracking_number;
    bit<48> timestamp;
    bit<8>  breached_level;
}

header itch_ipo_quoting_t {
    bit<16> stock_locate;
    bit<16> tracking_number;
    bit<48> timestamp;
    bit<64> stock;
    bit<32> release_time;
    bit<8>  release_qualifier;
    bit<32> ipo_price;
}

header itch_luld_collar_t {
    bit<16> stock_locate;
    bit<16> tracking_number;
    bit<48> timestamp;
    bit<64> stock;
    bit<32> reference_price;
    bit<32> upper_price;
    bit<32> lower_price;
    bit<32> extension;
}

header itch_operational_halt_t {
    bit<16> stock_locate;
    bit<16> tracking_number;
    bit<48> timestamp;
    bit<64> stock;
    bit<8>  market_code;
    bit<8>  halt_action;
}

header itch_executed_t {
    bit<16> stock_locate;
    bit<16> tracking_number;
    bit<48> timestamp;
    bit<64> order_ref_number;
    bit<32> executed_shares;
    bit<64> match_number;
}

header itch_executed_price_t {
    bit<16> stock_locate;
    bit<16> tracking_number;
    bit<48> timestamp;
    bit<64> order_ref_number;
    bit<32> executed_shares;
    bit<64> match_number;
    bit<8>  printable;
    bit<32> execution_price;
}

header itch_cancel_t {
    bit<16> stock_locate;
    bit<16> tracking_number;
    bit<48> timestamp;
    bit<64> order_ref_number;
    bit<32> cancelled_shares;
}

header itch_delete_t {
    bit<16> stock_locate;
    bit<16> tracking_number;
    bit<48> timestamp;
    bit<64> order_ref_number;
}

header itch_replace_t {
    bit<16> stock_locate;
    bit<16> tracking_number;
    bit<48> timestamp;
    bit<64> original_order_ref_number;
    bit<64> new_order_ref_number;
    bit<32> shares;
    bit<32> price;
}

header itch_trade_t {
    bit<16> stock_locate;
    bit<16> tracking_number;
    bit<48> timestamp;
    bit<64> order_ref_number;
    bit<8>  buy_sell_indicator;
    bit<32> shares;
    bit<64> stock;
    bit<32> price;
    bit<64> match_number;
}

header itch_cross_trade_t {
    bit<16> stock_locate;
    bit<16> tracking_number;
    bit<48> timestamp;
    bit<64> shares;
    bit<64> stock;
    bit<32> cross_price;
    bit<64> match_number;
    bit<8>  cross_type;
}

header itch_broken_trade_t {
    bit<16> stock_locate;
    bit<16> tracking_number;
    bit<48> timestamp;
    bit<64> match_number;
}

header itch_noii_t {
    bit<16> stock_locate;
    bit<16> tracking_number;
    bit<48> timestamp;
    bit<64> paired_shares;
    bit<64> imbalance_shares;
    bit<8>  imbalance_direction;
    bit<64> stock;
    bit<32> far_price;
    bit<32> near_price;
    bit<32> current_reference_price;
    bit<8>  cross_type;
    bit<8>  price_variation_indicator;
}

header itch_rpii_t {
    bit<16> stock_locate;
    bit<16> tracking_number;
    bit<48> timestamp;
    bit<64> stock;
    bit<8>  interest_flag;
}

header itch_dlcr_t {
    bit<16> stock_locate;
    bit<16> tracking_number;
    bit<48> timestamp;
    bit<64> stock;
    bit<8>  open_eligibility_status;
    bit<32> minimum_allowable_price;
    bit<32> maximum_allowable_price;
    bit<32> near_execution_price;
    bit<64> near_execution_time;
    bit<32> lower_price_range_collar;
    bit<32> upper_price_range_collar;
}

struct headers {
    ethernet_t       ethernet;
    ipv4_t           ipv4;
    udp_t            udp;
    moldudp64_t      mold;
    moldudp64_msg_t  mold_msg;
    itch_msg_type_t  itch;
    itch_add_order_t add_order;
    itch_mpid_t      add_order_mpid;
    itch_system_event_t     system_event;
    itch_stock_directory_t  stock_directory;
    itch_trading_action_t   trading_action;
    itch_reg_sho_t          reg_sho;
    itch_mp_position_t      mp_position;
    itch_mwcb_decline_t     mwcb_decline;
    itch_mwcb_status_t      mwcb_status;
    itch_ipo_quoting_t      ipo_quoting;
    itch_luld_collar_t      luld_collar;
    itch_operational_halt_t operational_halt;
    itch_executed_t         executed;
    itch_executed_price_t   executed_price;
    itch_cancel_t           cancel;
    itch_delete_t           delete_;
    itch_replace_t          replace;
    itch_trade_t            trade;
    itch_cross_trade_t      cross_trade;
    itch_broken_trade_t     broken_trade;
    itch_noii_t             noii;
    itch_rpii_t             rpii;
    itch_dlcr_t             dlcr;
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
            ITCH_ADD_ORDER_MPID: parse_add_order_mpid;
            ITCH_SYSTEM_EVENT: parse_system_event;
            ITCH_STOCK_DIRECTORY: parse_stock_directory;
            ITCH_TRADING_ACTION: parse_trading_action;
            ITCH_REG_SHO: parse_reg_sho;
            ITCH_MP_POSITION: parse_mp_position;
            ITCH_MWCB_DECLINE: parse_mwcb_decline;
            ITCH_MWCB_STATUS: parse_mwcb_status;
            ITCH_IPO_QUOTING: parse_ipo_quoting;
            ITCH_LULD_COLLAR: parse_luld_collar;
            ITCH_OPERATIONAL_HALT: parse_operational_halt;
            ITCH_EXECUTED: parse_executed;
            ITCH_EXECUTED_PRICE: parse_executed_price;
            ITCH_CANCEL: parse_cancel;
            ITCH_DELETE: parse_delete;
            ITCH_REPLACE: parse_replace;
            ITCH_TRADE: parse_trade;
            ITCH_CROSS_TRADE: parse_cross_trade;
            ITCH_BROKEN_TRADE: parse_broken_trade;
            ITCH_NOII: parse_noii;
            ITCH_RPII: parse_rpii;
            ITCH_DLCR: parse_dlcr;
            default: accept;
        }
    }

    state parse_add_order {
        packet.extract(hdr.add_order);
        transition accept;
    }

    state parse_add_order_mpid {
        packet.extract(hdr.add_order);
        packet.extract(hdr.add_order_mpid);
        transition accept;
    }

    state parse_system_event {
        packet.extract(hdr.system_event);
        transition accept;
    }

    state parse_stock_directory {
        packet.extract(hdr.stock_directory);
        transition accept;
    }

    state parse_trading_action {
        packet.extract(hdr.trading_action);
        transition accept;
    }

    state parse_reg_sho {
        packet.extract(hdr.reg_sho);
        transition accept;
    }

    state parse_mp_position {
        packet.extract(hdr.mp_position);
        transition accept;
    }

    state parse_mwcb_decline {
        packet.extract(hdr.mwcb_decline);
        transition accept;
    }

    state parse_mwcb_status {
        packet.extract(hdr.mwcb_status);
        transition accept;
    }

    state parse_ipo_quoting {
        packet.extract(hdr.ipo_quoting);
        transition accept;
    }

    state parse_luld_collar {
        packet.extract(hdr.luld_collar);
        transition accept;
    }

    state parse_operational_halt {
        packet.extract(hdr.operational_halt);
        transition accept;
    }

    state parse_executed {
        packet.extract(hdr.executed);
        transition accept;
    }

    state parse_executed_price {
        packet.extract(hdr.executed_price);
        transition accept;
    }

    state parse_cancel {
        packet.extract(hdr.cancel);
        transition accept;
    }

    state parse_delete {
        packet.extract(hdr.delete_);
        transition accept;
    }

    state parse_replace {
        packet.extract(hdr.replace);
        transition accept;
    }

    state parse_trade {
        packet.extract(hdr.trade);
        transition accept;
    }

    state parse_cross_trade {
        packet.extract(hdr.cross_trade);
        transition accept;
    }

    state parse_broken_trade {
        packet.extract(hdr.broken_trade);
        transition accept;
    }

    state parse_noii {
        packet.extract(hdr.noii);
        transition accept;
    }

    state parse_rpii {
        packet.extract(hdr.rpii);
        transition accept;
    }

    state parse_dlcr {
        packet.extract(hdr.dlcr);
        transition accept;
    }
}
