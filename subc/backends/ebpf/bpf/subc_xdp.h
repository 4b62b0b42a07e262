/* subc_xdp.h: the XDP program subc_xdp: each message classified (subc_classify.h) and noted, then the
 * datagram dropped, sent whole to its one recipient, or handed to the fan-out or to TC. */
#ifndef SUBC_XDP_H
#define SUBC_XDP_H

/* Record message i's leaf: the union of the subscribers, whether every message so far has the same
 * one subscriber, the local-stack flag, counters. */
static __always_inline void subc_note_leaf(struct subc_dgram *d, __u32 i, __u32 state, __u32 len)
{
    /* the lookup first, every store after it: no pointer into d lives across the call (fewer
     * spilled values that differ between paths keeps the verifier's state count low) */
    __u32 slot = SUBC_SLOT(state, SUBC_CAP_SUBC_LEAF);
    struct subc_leaf *lf = state == SUBC_UNDECODED ? 0 : bpf_map_lookup_elem(&subc_leaf, &slot);
    __u32 j = i & (SUBC_MAX_MSGS - 1);
    if (!lf) {
        subc_count(state == SUBC_UNDECODED ? SUBC_STAT_UNDECODED : SUBC_STAT_STALE);
        d->msg[j].leaf = SUBC_UNDECODED;
        d->msg[j].set = SUBC_NO_SET;
        d->single = SUBC_SINGLE_NONE;
        for (int w = 0; w < SUBC_SUB_WORDS; w++)
            d->every[w] = 0;
        return;
    }
    d->msg[j].leaf = state;
    /* the one recipient of the datagram so far: messages for no one do not count */
    d->msg[j].set = lf->set;
    if (lf->flags & SUBC_LEAF_PASS_LOCAL || lf->nsubs > 1 ||
        (lf->nsubs == 1 && d->one != SUBC_SINGLE_UNSET && d->one != lf->sub))
        d->one = SUBC_SINGLE_NONE;
    else if (lf->nsubs == 1)
        d->one = lf->sub;
    for (int w = 0; w < SUBC_SUB_WORDS; w++) {
        d->any[w] |= lf->subs[w];
        d->every[w] &= lf->subs[w];
    }
    if (lf->nsubs) {
        d->fwd_idx[d->nf & (SUBC_MAX_MSGS - 1)] = j;
        d->nf = d->nf + 1;
    }
    if (lf->flags & SUBC_LEAF_PASS_LOCAL)
        d->pass_any = 1;
    if (lf->nsubs != 1 || (lf->flags & SUBC_LEAF_PASS_LOCAL) ||
        (d->single != SUBC_SINGLE_UNSET && d->single != lf->sub))
        d->single = SUBC_SINGLE_NONE;
    else
        d->single = lf->sub;
    struct subc_counter *lc = bpf_map_lookup_elem(&subc_leaf_cnt, &slot);
    if (lc) {
        lc->messages += 1;
        lc->bytes += len;
    }
}

/* Classify up to SUBC_MSGS_PER_PROG more messages of the datagram.  Returns 1 when every message
 * is classified, 0 when more remain, -1 for a malformed datagram. */
static __always_inline int subc_classify_some(void *data, void *data_end, struct subc_dgram *d, __u16 dport)
{
    __u32 base = (d->l4 & 0x7f) + sizeof(struct udphdr);
#if SUBC_MOLD
    __u32 classified = 0;
    int bad = 0;
#if SUBC_ARRIVAL_TIME
    if (d->done == 0)
        d->now = bpf_ktime_get_ns();
#endif
    for (int k = 0; k < SUBC_MSGS_PER_PROG; k++) {
        __u32 i = d->done;
        if (i >= d->n)
            break;
        __u32 off = d->cur;
        if (off + 2 > d->plen) {
            bad = 1;
            break;
        }
        __u8 *lp = data + base + (off & (SUBC_PAYLOAD_MAX - 1));
        if ((void *)(lp + 2) > data_end) {
            bad = 1;
            break;
        }
        __u32 len = ((__u32)lp[0] << 8) | lp[1];
        if (off + 2 + len > d->plen) {
            bad = 1;
            break;
        }
        classified++;
        d->msg[i & (SUBC_MAX_MSGS - 1)].off = off;
        d->msg[i & (SUBC_MAX_MSGS - 1)].len = len;
        __u32 state = subc_classify_msg(data, data_end, d, base, off & (SUBC_PAYLOAD_MAX - 1), len, dport);
#ifdef SUBC_BENCH_NO_NOTE
        d->msg[i & (SUBC_MAX_MSGS - 1)].leaf = state;
#else
        subc_note_leaf(d, i, state, len);
#endif
        d->cur = off + 2 + len;
        d->done = i + 1;
    }
    subc_count_n(SUBC_STAT_MESSAGES, classified);
    if (bad)
        return -1;
    if (d->done < d->n)
        return 0;
    return d->cur == d->plen ? 1 : -1;
#else
#if SUBC_ARRIVAL_TIME
    d->now = bpf_ktime_get_ns();
#endif
    d->msg[0].off = 0;
    d->msg[0].len = d->plen;
    __u32 state = subc_classify_msg(data, data_end, d, base, 0, d->plen, dport);
    subc_count(SUBC_STAT_MESSAGES);
    subc_note_leaf(d, 0, state, d->plen);
    d->done = 1;
    return 1;
#endif
}

/* Rewrite a whole-datagram copy for endpoint ep in XDP: Ethernet addresses, IPv4 source and
 * destination, UDP destination port and (MoldUDP64) sequence number; IPv4 and UDP checksums
 * updated incrementally (a zero UDP checksum means none, RFC 768).  Returns 0, or -1 when the
 * headers are not within [data, data_end). */
static __always_inline int subc_rewrite(void *data, void *data_end, __u32 l3, __u32 l4, struct subc_endpoint *ep,
                                        __u64 seq)
{
    struct ethhdr *eth = data;
    struct iphdr *ip = data + (l3 & 0xff);
    struct udphdr *udp = data + (l4 & 0x1ff);
    if ((void *)(eth + 1) > data_end || (void *)(ip + 1) > data_end || (void *)(udp + 1) > data_end)
        return -1;
#if SUBC_MOLD
    __u32 *sq = (void *)(udp + 1) + 10;
    if ((void *)(sq + 2) > data_end)
        return -1;
    __u32 new_hi = SUBC_HTONL((__u32)(seq >> 32)), new_lo = SUBC_HTONL((__u32)seq);
#endif
    __builtin_memcpy(eth->h_dest, ep->dmac, 6);
    __builtin_memcpy(eth->h_source, ep->smac, 6);
    __u32 old_s = ip->saddr, old_d = ip->daddr;
    __u16 old_p = udp->dest;
    subc_csum_replace4(&ip->check, old_s, ep->saddr);
    subc_csum_replace4(&ip->check, old_d, ep->daddr);
    if (udp->check) {
        __u16 c = udp->check;
        subc_csum_replace4(&c, old_s, ep->saddr);
        subc_csum_replace4(&c, old_d, ep->daddr);
        subc_csum_replace2(&c, old_p, ep->dport);
#if SUBC_MOLD
        subc_csum_replace4(&c, sq[0], new_hi);
        subc_csum_replace4(&c, sq[1], new_lo);
#endif
        udp->check = c ? c : 0xffff;
    }
#if SUBC_MOLD
    sq[0] = new_hi;
    sq[1] = new_lo;
#endif
    ip->saddr = ep->saddr;
    ip->daddr = ep->daddr;
    udp->dest = ep->dport;
    return 0;
}

/* Hand a classified datagram to the copy builders: its ring slot (and the fan-out mode, 0 for TC)
 * in the XDP metadata.  Returns 0, or -1 when the metadata cannot be written. */
static __always_inline int subc_set_meta(struct xdp_md *ctx, struct subc_dgram *d, __u32 slot, __u32 mode)
{
    if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(struct subc_meta)))
        return -1;
    struct subc_meta *m = (void *)(long)ctx->data_meta;
    void *data = (void *)(long)ctx->data;
    if ((void *)(m + 1) > data)
        return -1;
    m->magic = SUBC_META_MAGIC;
    m->slot = slot;
    m->tag = d->tag;
    m->mode = mode;
    return 0;
}

/* Pass a classified datagram to TC, which builds its copies. */
static __always_inline int subc_to_tc(struct xdp_md *ctx, struct subc_dgram *d, __u32 slot)
{
    if (subc_set_meta(ctx, d, slot, SUBC_FAN_TC)) {
        subc_count(SUBC_STAT_ERRORS);
        return XDP_DROP;
    }
    subc_count(SUBC_STAT_TO_TC);
    return XDP_PASS;
}

/* Decide what happens to a classified datagram in XDP: dropped, fanned out through the device
 * map (every copy built by a devmap egress program), sent whole from XDP, or handed to TC in the
 * metadata. */
static __always_inline int subc_xdp_finish(struct xdp_md *ctx, struct subc_dgram *d, __u32 slot)
{
    __u32 zero = 0;
    void *data = (void *)(long)ctx->data;
    void *data_end = (void *)(long)ctx->data_end;
    int hb = SUBC_HEARTBEAT_OR_END(d);
    int none = !d->pass_any;
    for (int w = 0; w < SUBC_SUB_WORDS; w++)
        if (d->any[w])
            none = 0;
    if (none && !hb) {
        subc_count(SUBC_STAT_DROPPED);
        return XDP_DROP;
    }
    if (d->vlan) {
        /* Copies leave untagged: move the MAC addresses over the 802.1Q tag. */
        __u8 macs[12];
        if (data + 18 > data_end)
            return XDP_DROP;
        __builtin_memcpy(macs, data, 12);
        if (bpf_xdp_adjust_head(ctx, 4))
            return XDP_DROP;
        data = (void *)(long)ctx->data;
        data_end = (void *)(long)ctx->data_end;
        if (data + 14 > data_end)
            return XDP_DROP;
        __builtin_memcpy(data, macs, 12);
        d->l3 -= 4;
        d->l4 -= 4;
        d->vlan = 0;
    }
    /* A journal-only recipient (no endpoint: its copies go to the journal only): TC builds every
     * copy of the datagram, so that each recipient's sequence numbers are taken in one place. */
    if (!hb && subc_jnl_only_any(d))
        return subc_to_tc(ctx, d, slot);
    if (hb && subc_fenced()) { /* past the fence: the broker that owns the stream sends its heartbeats */
        subc_count(SUBC_STAT_FENCED);
        return XDP_DROP;
    }
    /* XDP fan-out, when the loader switched it on: every copy (one recipient or many) is built by a
     * devmap egress program, so that each subscriber's sequence numbers are taken in the order its
     * copies leave. */
    struct subc_fan_cfg *fc = bpf_map_lookup_elem(&subc_fan_cfg, &zero);
    if (fc && fc->n_eps && !d->pass_any) {
        bpf_tail_call(ctx, &subc_jmp_xdp, 2);
        subc_count(SUBC_STAT_ERRORS); /* the tail call failed: the paths below build the copies */
    }
    /* Whole datagram to one endpoint: every message goes to the same one subscriber, no other. */
    if (!hb && d->single < SUBC_LOCAL) {
        __u32 r = d->single & (SUBC_LOCAL - 1);
        struct subc_sub *sub = bpf_map_lookup_elem(&subc_subs, &r);
        if (sub && sub->count == 1) {
            __u32 e = sub->ep[0];
            struct subc_endpoint *ep = bpf_map_lookup_elem(&subc_eps, &e);
            if (!ep) {
                subc_count(SUBC_STAT_ERRORS);
                return XDP_DROP;
            }
            struct subc_jrec *j = subc_jnl_reserve(r, d->n); /* before the number: subc_journal.h */
            __u64 seq = subc_next_seq(r, d->n);
            __u32 cpu = bpf_get_smp_processor_id();
            struct subc_scratch *s = bpf_map_lookup_elem(&subc_scratch, &cpu);
            if (subc_rewrite(data, data_end, d->l3, d->l4, ep, seq) < 0) {
                subc_jnl_commit_xdp(j, ctx, s, r, d->n, 0, 0); /* nothing to journal: discarded, counted */
                subc_count(SUBC_STAT_ERRORS);
                return XDP_DROP;
            }
            subc_jnl_commit_xdp(j, ctx, s, r, d->n, d->l4 + 8, d->plen);
            data = (void *)(long)ctx->data;
            data_end = (void *)(long)ctx->data_end;
            subc_count(SUBC_STAT_XDP_UNICAST);
            subc_count_sub(r, d->n, data_end - data);
            if (ep->ifindex == ctx->ingress_ifindex)
                return XDP_TX;
            return bpf_redirect(ep->ifindex, 0);
        }
    }
#if SUBC_MOLD
    /* One recipient with one endpoint, other messages for no one: its copy is built in place in XDP. */
    if (!hb && !d->pass_any && d->one < SUBC_LOCAL) {
        __u32 r = d->one & (SUBC_LOCAL - 1);
        struct subc_sub *sub = bpf_map_lookup_elem(&subc_subs, &r);
        if (sub && sub->count == 1) {
            bpf_tail_call(ctx, &subc_jmp_xdp, 1);
            subc_count(SUBC_STAT_ERRORS); /* the tail call failed: TC builds the copy */
        }
    }
#endif
    return subc_to_tc(ctx, d, slot);
}

static __always_inline int subc_xdp_step(struct xdp_md *ctx, struct subc_dgram *d, __u32 slot)
{
    void *data = (void *)(long)ctx->data;
    void *data_end = (void *)(long)ctx->data_end;
    __u16 dport = 0;
    struct udphdr *udp = data + (d->l4 & 0x7f);
    if ((void *)(udp + 1) > data_end)
        return XDP_DROP;
    dport = SUBC_HTONS(udp->dest);
    int r = subc_classify_some(data, data_end, d, dport);
    if (r < 0) {
        subc_count(SUBC_STAT_MALFORMED);
        return XDP_DROP;
    }
    if (r == 0) {
        bpf_tail_call(ctx, &subc_jmp_xdp, 0);
        subc_count(SUBC_STAT_ERRORS); /* the tail call failed */
        return XDP_DROP;
    }
    return subc_xdp_finish(ctx, d, slot);
}

SUBC_SEC("xdp")
int subc_xdp(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *data_end = (void *)(long)ctx->data_end;
    subc_count(SUBC_STAT_RX);
    __u32 zero = 0, one = 1;
    __u32 *ctr = bpf_map_lookup_elem(&subc_cur, &zero);
    __u32 *cur_slot = bpf_map_lookup_elem(&subc_cur, &one);
    __u32 *root = bpf_map_lookup_elem(&subc_root, &zero);
    if (!ctr || !cur_slot || !root)
        return XDP_PASS;
    __u32 tag = *ctr + 1;
    *ctr = tag;
    __u32 slot = bpf_get_smp_processor_id() * SUBC_SLOTS + (tag % SUBC_SLOTS);
    struct subc_dgram *d = bpf_map_lookup_elem(&subc_ring, &slot);
    if (!d)
        return XDP_PASS;
    __u16 dport = 0;
    int r = subc_network(data, data_end, d, &dport);
    if (r == SUBC_NOT_OURS) {
        subc_count(SUBC_STAT_NOT_OURS);
        return XDP_PASS;
    }
    if (r == SUBC_MALFORMED) {
        subc_count(SUBC_STAT_MALFORMED);
        return XDP_DROP;
    }
    *cur_slot = slot;
    d->tag = tag;
    d->root = *root;
    d->done = 0;
    d->pass_any = 0;
    d->single = SUBC_SINGLE_UNSET;
    d->one = SUBC_SINGLE_UNSET;
    d->nf = 0;
    for (int w = 0; w < SUBC_SUB_WORDS; w++) {
        d->any[w] = 0;
        d->every[w] = ~0ull;
    }
#if SUBC_MOLD
    __u8 *h = data + (d->l4 & 0x7f) + sizeof(struct udphdr);
    if (d->plen < SUBC_MOLD_HEADER || (void *)(h + SUBC_MOLD_HEADER) > data_end) {
        subc_count(SUBC_STAT_MALFORMED);
        return XDP_DROP;
    }
    d->count = ((__u32)h[18] << 8) | h[19];
    d->cur = SUBC_MOLD_HEADER;
    d->root = subc_sched_root(h, d->count, d->root);
    if (d->count == SUBC_HEARTBEAT || d->count == SUBC_END_OF_SESSION) {
        if (d->plen != SUBC_MOLD_HEADER) {
            subc_count(SUBC_STAT_MALFORMED);
            return XDP_DROP;
        }
        subc_count(SUBC_STAT_HEARTBEATS);
        d->n = 0;
        return subc_xdp_finish(ctx, d, slot);
    }
    if (d->count > SUBC_MAX_MSGS || d->plen >= SUBC_PAYLOAD_MAX) {
        subc_count(SUBC_STAT_TOO_BIG);
        return XDP_PASS;
    }
    d->n = d->count;
#else
    if (d->plen >= SUBC_PAYLOAD_MAX) {
        subc_count(SUBC_STAT_TOO_BIG);
        return XDP_PASS;
    }
    d->count = 1;
    d->n = 1;
    d->cur = 0;
#endif
    return subc_xdp_step(ctx, d, slot);
}

/* The tail call target of subc_xdp (subc_jmp_xdp[0]): the next messages of the same datagram. */
SUBC_SEC("xdp")
int subc_xdp_more(struct xdp_md *ctx)
{
    __u32 one = 1;
    __u32 *cur_slot = bpf_map_lookup_elem(&subc_cur, &one);
    if (!cur_slot)
        return XDP_DROP;
    __u32 slot = *cur_slot;
    struct subc_dgram *d = bpf_map_lookup_elem(&subc_ring, &slot);
    if (!d)
        return XDP_DROP;
    return subc_xdp_step(ctx, d, slot);
}

#endif /* SUBC_XDP_H */
