/* subc_types.h: the static program's own types: the aggregate registers (SUBC_STATE), a
 * subscriber's endpoints, the per-datagram ring slot shared by XDP and TC, and TC's scratch.  The
 * types subc's map writers also pack (subc_info, subc_leaf, subc_endpoint, ...) are generated in
 * subc_config.h from one description each (backends/ebpf/layout.py). */
#ifndef SUBC_TYPES_H
#define SUBC_TYPES_H

#if SUBC_STATE
/* Masks (bit k: bit k % 64 of word k / 64): the instances a message updates; the named-counter
 * updates a leaf applies. */
struct subc_umask {
    __u64 w[SUBC_UPD_WORDS];
};
#if SUBC_COUNTERS
struct subc_cmask {
    __u64 w[SUBC_CNT_WORDS];
};
#endif
/* One aggregate instance's registers (docs/state.md "Stateful subscriptions"): the window of its last
 * update.  Updated and read under its spin lock, so that a window reset and an update, or a read
 * of the window id and the values, are one step for every CPU. */
struct subc_agg {
    struct bpf_spin_lock lock;
    __u32 pad;
    __u64 wid; /* window id: time / window length */
    __u64 count;
    __u64 total;                       /* sum, saturating */
    __u64 extreme;                     /* min or max */
    __s64 excess[SUBC_AGG_THRESHOLDS]; /* avg: sum of (value - threshold), per threshold */
};
#endif
struct subc_sub {
    __u32 count;
    __u32 ep[SUBC_MAX_ENDPOINTS];
};

struct subc_vlan_hdr {
    __be16 tci;
    __be16 proto;
};

/* One message of a datagram: its block's offset in the UDP payload (at its 2-byte length), its
 * length (without the 2 bytes) and its (tagged) leaf state, or SUBC_UNDECODED. */
struct subc_msg {
    __u16 off;
    __u16 len;
    __u32 leaf;
    __u32 set; /* the leaf's subscriber set in subc_leaf_set, or SUBC_NO_SET */
};

/* A datagram being classified (XDP) and copied (TC): a slot of subc_ring. */
struct subc_dgram {
    __u32 tag;    /* per-CPU datagram counter when XDP took the slot; the XDP metadata names it */
    __u32 l3, l4; /* IPv4 and UDP header offsets in the frame (after any VLAN tag is removed) */
    __u32 vlan;
    __u32 plen;                /* UDP payload bytes */
    __u32 count;               /* MoldUDP64 message count field */
    __u32 n;                   /* messages */
    __u32 done;                /* messages classified so far */
    __u32 cur;                 /* payload offset of the next message block */
    __u32 root;                /* root state (with the generation bit) read once for the datagram */
    __u64 now;                 /* bpf_ktime_get_ns() when the datagram's first message is classified */
    __u32 pass_any;            /* some message goes to the local stack */
    __u32 single;              /* the one subscriber of every message (SUBC_SINGLE_UNSET / _NONE: none such) */
    __u32 one;                 /* the one subscriber of every message that goes anywhere (SUBC_SINGLE_UNSET / _NONE) */
    __u64 any[SUBC_SUB_WORDS]; /* union of the messages' subscribers */
    __u64 every[SUBC_SUB_WORDS];   /* intersection of the messages' subscribers: who takes every message */
    __u32 nf;                      /* messages that go to at least one subscriber, listed in fwd_idx */
    __u32 fan_n;                   /* XDP fan-out: recipient endpoints in fan_ep */
    __u32 fan_group;               /* XDP fan-out (FAN_LIST): the recipients' group */
    __u16 fan_ep[SUBC_FAN_SLOTS];  /* XDP fan-out (FAN_LIST): recipient endpoints, in clone order */
    __u8 fan_next[SUBC_FAN_SLOTS]; /* XDP fan-out: clones of the datagram built so far, per group */
    __u8 fan_grp[SUBC_FAN_SLOTS];  /* XDP fan-out (FAN_SET): the group of each fan_ep */
    struct subc_msg msg[SUBC_MAX_MSGS];
    __u16 fwd_idx[SUBC_MAX_MSGS]; /* the messages that go to at least one subscriber, in order (nf of them) */
};

/* The sequence number a subscriber's copy of one datagram took (per CPU): the datagram's other
 * copies to that subscriber's other endpoints carry the same number. */
struct subc_seq_res {
    __u32 slot;
    __u32 tag;
    __u64 seq;
};

/* The journal feed's records (subc_journal.h): a copy's recipient, UDP payload length and flags,
 * then its payload (or its MoldUDP64 header alone, the payload following as a record of its own:
 * a subc_jhdr then the payload). */
struct subc_jhdr {
    __u32 r;
    __u16 len;
    __u16 flags;
};
struct subc_jrec {
    __u32 r;
    __u16 len;
    __u16 flags;
    __u8 data[SUBC_JREC_INLINE];
};

/* A cluster's root switches at feed positions (subc_cluster.h); its entries' type, struct
 * subc_sched_entry, and struct subc_pos are generated (backends/ebpf/layout.py). */
#define SUBC_SCHED 16 /* layout.py SCHED_ENTRIES */
struct subc_sched {
    struct bpf_spin_lock lock;
    __u32 n;
    __u32 on; /* a cluster's daemon writes the table: positions are tracked (else the base root alone) */
    __u32 pad;
    struct subc_sched_entry e[SUBC_SCHED];
};

/* What TC needs while building the copies of one datagram (one per CPU). */
struct subc_scratch {
    __u32 nr;     /* recipients */
    __u32 next;   /* next recipient to build */
    __u32 local;  /* the local stack is a recipient */
    __u32 csum;   /* the datagram carried a UDP checksum */
    __u32 slot;   /* the datagram's ring slot (for the tail calls) */
    __u32 zero;   /* always 0 */
    __u8 hdr[80]; /* the datagram's Ethernet and IPv4 headers (IPv4 at byte 14) */
    struct udphdr udph;
    __u16 rcpt[SUBC_MAX_RCPT];
    __u64 subs[SUBC_MAX_MSGS][SUBC_SUB_WORDS];
    __u8 local_msg[SUBC_MAX_MSGS];
    __u8 orig[SUBC_BUF];
    struct subc_jhdr jhdr; /* the journal's payload record: this header, then copy (no padding between) */
    __u8 copy[SUBC_BUF];
};
#endif /* SUBC_TYPES_H */
