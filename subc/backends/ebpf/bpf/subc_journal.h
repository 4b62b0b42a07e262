/* subc_journal.h: the journal feed (SUBC_JOURNAL, subc load --journal): every copy a subscriber is
 * sent, as the bytes sent, passed to user space through the BPF ring buffer subc_jnl, where
 * subc/recovery/journal_feed.py appends it to the subscriber's journal (docs/recovery.md).
 *
 * One copy, one record (struct subc_jrec, SUBC_JREC_BYTES): the recipient, the copy's UDP payload
 * length, and its payload (the MoldUDP64 header with the recipient's session, sequence number and
 * count, then the message blocks) when it fits (SUBC_JREC_INLINE); else the record holds the
 * 20-byte header and the payload follows as a record of its own (struct subc_jhdr then the
 * payload, written by bpf_ringbuf_output: any length).
 *
 * Order.  The record is reserved *before* the copy's sequence number is taken, and submitted after
 * the payload record: so when user space reads a record of recipient r, every record of r with a
 * lower sequence number was reserved before the ring's producer position it reads next, and a
 * sequence number still missing once the consumer has reached that position was never journaled
 * (its reservation failed).  User space finds every such loss exactly, without a timeout.
 *
 * Losses are counted, never silent: a record that finds the ring full (the copy is sent all the
 * same, its messages missing from the journal): SUBC_STAT_JOURNAL_LOST and the recipient's
 * subc_jnl_lost (messages); a payload record that finds it full: the same, and its record says so
 * (SUBC_JREC_LOST), naming the messages. */
#ifndef SUBC_JOURNAL_H
#define SUBC_JOURNAL_H

#if SUBC_JOURNAL && SUBC_MOLD
#define SUBC_JREC_PAYLOAD 1 /* flags: the payload is in the record */
#define SUBC_JREC_NEXT 2    /* the payload is a record of its own (subc_jhdr, flags SUBC_JREC_BODY) */
#define SUBC_JREC_LOST 4    /* the payload record found the ring full: the messages are not journaled */
#define SUBC_JREC_BODY 8    /* (subc_jhdr.flags) a payload record */

/* Reserve recipient r's record for a copy of k messages, before its sequence number is taken.
 * NULL when nothing is journaled (the local stack, a heartbeat) or the ring is full (counted). */
static __always_inline struct subc_jrec *subc_jnl_reserve(__u32 r, __u32 k)
{
    if (r >= SUBC_LOCAL || k == 0)
        return 0;
    struct subc_jrec *j = bpf_ringbuf_reserve(&subc_jnl, sizeof(struct subc_jrec), 0);
    if (!j) {
        subc_count(SUBC_STAT_JOURNAL_LOST);
        __u64 *lost = bpf_map_lookup_elem(&subc_jnl_lost, &r);
        if (lost)
            *lost += k;
    }
    return j;
}

/* Fill record j of recipient r (k messages) with the copy's payload, s->copy[0, clen), and submit
 * it (after its payload record when the payload does not fit). */
static __always_inline void subc_jnl_commit(struct subc_jrec *j, struct subc_scratch *s, __u32 r, __u32 k, __u32 clen)
{
    if (!j)
        return;
    j->r = r;
    j->len = clen;
    if (clen <= SUBC_JREC_INLINE) {
        j->flags = SUBC_JREC_PAYLOAD;
        /* the whole inline area, a constant size: plain loads and stores, no helper call (the
         * bytes past clen are the scratch's leftovers; the reader takes len bytes) */
        __builtin_memcpy(j->data, s->copy, SUBC_JREC_INLINE);
    } else {
        __builtin_memcpy(j->data, s->copy, SUBC_MOLD_HEADER);
        s->jhdr.r = r;
        s->jhdr.len = clen;
        s->jhdr.flags = SUBC_JREC_BODY;
        __u32 n = clen & (SUBC_PAYLOAD_MAX - 1);
        if (bpf_ringbuf_output(&subc_jnl, &s->jhdr, sizeof(struct subc_jhdr) + n, 0)) {
            j->flags = SUBC_JREC_LOST;
            subc_count(SUBC_STAT_JOURNAL_LOST);
            __u64 *lost = bpf_map_lookup_elem(&subc_jnl_lost, &r);
            if (lost)
                *lost += k;
        } else {
            j->flags = SUBC_JREC_NEXT;
        }
    }
    bpf_ringbuf_submit(j, 0);
}

/* subc_jnl_commit for a copy sent whole from XDP: its payload, plen bytes from frame offset base
 * (the UDP payload, sequence number written), loaded into s->copy first.  A payload that cannot
 * be loaded discards the record (counted: user space finds the loss as for a full ring). */
static __always_inline void subc_jnl_commit_xdp(struct subc_jrec *j, struct xdp_md *ctx, struct subc_scratch *s,
                                                __u32 r, __u32 k, __u32 base, __u32 plen)
{
    if (!j)
        return;
    __u32 n = plen & (SUBC_PAYLOAD_MAX - 1);
    if (!s || n != plen || n < SUBC_MOLD_HEADER || bpf_xdp_load_bytes(ctx, base, s->copy, n)) {
        bpf_ringbuf_discard(j, 0);
        subc_count(SUBC_STAT_JOURNAL_LOST);
        __u64 *lost = bpf_map_lookup_elem(&subc_jnl_lost, &r);
        if (lost)
            *lost += k;
        return;
    }
    subc_jnl_commit(j, s, r, k, n);
}
/* Whether datagram d goes to a journal-only recipient (subc_jnl_only: a SoupBinTCP subscriber
 * without a UDP endpoint, or anyone past the fence): TC builds its copies then, journaling theirs
 * without sending them. */
static __always_inline int subc_jnl_only_any(struct subc_dgram *d)
{
    __u32 zero = 0;
    if (subc_fenced()) {
        __u64 any = 0;
        for (int w = 0; w < SUBC_SUB_WORDS; w++)
            any |= d->any[w];
        if (any)
            subc_count(SUBC_STAT_FENCED);
        return any != 0;
    }
    struct subc_set *jo = bpf_map_lookup_elem(&subc_jnl_only, &zero);
    if (!jo)
        return 0;
    __u64 hit = 0;
    for (int w = 0; w < SUBC_SUB_WORDS; w++)
        hit |= d->any[w] & jo->subs[w];
    return hit != 0;
}

/* Whether recipient r is journal-only (marked, or past the fence). */
static __always_inline int subc_jnl_only_has(__u32 r)
{
    __u32 zero = 0;
    if (r >= SUBC_LOCAL)
        return 0;
    if (subc_fenced())
        return 1;
    struct subc_set *jo = bpf_map_lookup_elem(&subc_jnl_only, &zero);
    return jo && ((jo->subs[(r >> 6) & (SUBC_SUB_WORDS - 1)] >> (r & 63)) & 1);
}
#else
static __always_inline int subc_jnl_only_any(struct subc_dgram *d)
{
    return 0;
}
static __always_inline int subc_jnl_only_has(__u32 r)
{
    return 0;
}
struct subc_jrec;
static __always_inline struct subc_jrec *subc_jnl_reserve(__u32 r, __u32 k)
{
    return 0;
}
static __always_inline void subc_jnl_commit(struct subc_jrec *j, struct subc_scratch *s, __u32 r, __u32 k, __u32 clen)
{
}
static __always_inline void subc_jnl_commit_xdp(struct subc_jrec *j, struct xdp_md *ctx, struct subc_scratch *s,
                                                __u32 r, __u32 k, __u32 base, __u32 plen)
{
}
#endif /* SUBC_JOURNAL && SUBC_MOLD */

#endif /* SUBC_JOURNAL_H */
