/* subc_fanout.h: copies built in XDP: the one-recipient repack (subc_xdp_one) and the fan-out over
 * device maps (subc_xdp_fan, and subc_egress on each clone). */
#ifndef SUBC_FANOUT_H
#define SUBC_FANOUT_H

/* The sequence number of recipient r's copy (of n messages) of the datagram in ring slot `slot`
 * with tag `tag`, taken from the fan-out's egress programs: the first copy to one of r's endpoints
 * takes it (subc_next_seq), the copies to r's other endpoints reuse it (per CPU: one datagram's
 * copies are built on the CPU that received it).  *j: the copy's journal record, when its number is
 * new (else NULL), for subc_jnl_commit. */
static __always_inline __u64 subc_fan_seq(__u32 r, __u32 n, __u32 slot, __u32 tag, struct subc_jrec **j)
{
    struct subc_seq_res *res = bpf_map_lookup_elem(&subc_seq_res, &r);
    *j = 0;
    if (res && res->slot == slot && res->tag == tag)
        return res->seq;
    /* a new number: the copy's journal record is reserved first (subc_journal.h "Order") */
    *j = subc_jnl_reserve(r, n);
    __u64 seq = subc_next_seq(r, n);
    if (!res)
        return seq;
    res->slot = slot;
    res->tag = tag;
    res->seq = seq;
    return seq;
}

/* Whether message i of d (one of fwd_idx: it goes to someone) goes to recipient r (word/bit: r's
 * place in a subscriber set): by_set, its leaf's subscriber set (subc_leaf_set) has r; else yes
 * (the datagram's one recipient takes every message that goes to anyone). */
static __always_inline int subc_takes(struct subc_dgram *d, __u32 i, __u32 word, __u64 bit, int by_set)
{
    if (!by_set)
        return 1;
    __u32 set = d->msg[i & (SUBC_MAX_MSGS - 1)].set;
    struct subc_set *ss = bpf_map_lookup_elem(&subc_leaf_set, &set);
    return ss && (ss->subs[word & (SUBC_SUB_WORDS - 1)] & bit);
}

/* Build in place recipient r's copy of datagram d for endpoint ep: r's messages read in order
 * into the per-CPU copy buffer (bpf_xdp_load_bytes), the MoldUDP64 header with its count and
 * sequence number written back over the payload (bpf_xdp_store_bytes), the tail cut
 * (bpf_xdp_adjust_tail); Ethernet, IPv4 (checksum updated incrementally, RFC 1624) and UDP (length;
 * checksum computed anew when the datagram had one) rewritten.  by_set: see subc_takes; fan: the
 * sequence number is taken by subc_fan_seq (else subc_next_seq).  Returns the copy's messages, or
 * -1.  The TC path's buffers are free here: TC loads them afresh for every datagram it copies. */
static __always_inline int subc_repack(struct xdp_md *ctx, struct subc_dgram *d, struct subc_scratch *s,
                                       struct subc_endpoint *ep, __u32 r, int by_set, __u32 slot)
{
#if SUBC_MOLD
    void *data = (void *)(long)ctx->data;
    void *data_end = (void *)(long)ctx->data_end;
    __u32 l4 = d->l4 & 0x7f;
    if (d->l3 != ETH_HLEN || l4 < ETH_HLEN + 20 || d->plen >= SUBC_PAYLOAD_MAX)
        return -1;
    struct udphdr *udp = data + l4;
    if ((void *)(udp + 1) > data_end)
        return -1;
    __u32 had_csum = udp->check != 0;
    __u32 base = l4 + sizeof(struct udphdr);
    __u32 word = (r >> 6) & (SUBC_SUB_WORDS - 1);
    __u64 bit = 1ull << (r & 63);
    /* pos and k start from values the verifier does not know (s->zero is 0): see subc_build_copy */
    __u32 pos = (s->zero + SUBC_MOLD_HEADER) & (SUBC_PAYLOAD_MAX - 1);
    __u32 k = s->zero & 1023;
    /* only the messages that go to someone (fwd_idx): a copy's cost follows them, not the datagram */
    for (int f = 0; f < SUBC_MAX_MSGS; f++) {
        if (f >= d->nf)
            break;
        __u32 i = d->fwd_idx[f] & (SUBC_MAX_MSGS - 1);
        if (!subc_takes(d, i, word, bit, by_set))
            continue;
        __u32 off = d->msg[i].off & (SUBC_PAYLOAD_MAX - 1);
        __u32 n = (d->msg[i].len + 2) & (SUBC_PAYLOAD_MAX - 1);
        if (n < 2)
            return -1;
        if (bpf_xdp_load_bytes(ctx, base + off, &s->copy[pos & (SUBC_PAYLOAD_MAX - 1)], n))
            return -1;
        pos = (pos + n) & (SUBC_PAYLOAD_MAX - 1);
        k = (k + 1) & 1023;
    }
    if (bpf_xdp_load_bytes(ctx, base, s->copy, 10))
        return -1;
    struct subc_jrec *j = 0;
    __u64 seq;
    if (by_set) {
        seq = subc_fan_seq(r, k, slot, d->tag, &j);
    } else {
        j = subc_jnl_reserve(r, k);
        seq = subc_next_seq(r, k);
    }
    __u64 bseq = SUBC_HTONLL(seq);
    __builtin_memcpy(&s->copy[10], &bseq, 8);
    s->copy[18] = k >> 8;
    s->copy[19] = k & 0xff;
    __u32 clen = pos & (SUBC_PAYLOAD_MAX - 1);
    /* journaled as built, before it is sent: a copy that fails below is still in the journal */
    subc_jnl_commit(j, s, r, k, clen);
    s->copy[clen & (SUBC_BUF - 1)] = 0;
    s->copy[(clen + 1) & (SUBC_BUF - 1)] = 0;
    s->copy[(clen + 2) & (SUBC_BUF - 1)] = 0;
    __u32 padded = (clen + 3) & ~3u;
    __u32 sum = 0;
    if (had_csum) {
        for (int c = 0; c < SUBC_PAYLOAD_MAX / 512; c++) {
            __u32 at = c * 512;
            if (at >= padded)
                break;
            __u32 sz = padded - at;
            if (sz > 512)
                sz = 512;
            __s64 r2 = bpf_csum_diff(0, 0, (void *)&s->copy[at & (SUBC_PAYLOAD_MAX - 1)], sz & 0x3fc, sum);
            if (r2 < 0)
                return -1;
            sum = (__u32)r2;
        }
    }
    if (clen < SUBC_MOLD_HEADER || clen > d->plen)
        return -1;
    if (bpf_xdp_store_bytes(ctx, base, s->copy, clen))
        return -1;
    int delta = (int)clen - (int)d->plen;
    if (delta && bpf_xdp_adjust_tail(ctx, delta))
        return -1;
    data = (void *)(long)ctx->data;
    data_end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    struct iphdr *ip = data + ETH_HLEN;
    udp = data + l4;
    if ((void *)(eth + 1) > data_end || (void *)(ip + 1) > data_end || (void *)(udp + 1) > data_end)
        return -1;
    __builtin_memcpy(eth->h_dest, ep->dmac, 6);
    __builtin_memcpy(eth->h_source, ep->smac, 6);
    __u16 new_len = SUBC_HTONS(l4 - ETH_HLEN + sizeof(struct udphdr) + clen);
    subc_csum_replace4(&ip->check, ip->saddr, ep->saddr);
    subc_csum_replace4(&ip->check, ip->daddr, ep->daddr);
    subc_csum_replace2(&ip->check, ip->tot_len, new_len);
    ip->tot_len = new_len;
    ip->saddr = ep->saddr;
    ip->daddr = ep->daddr;
    udp->dest = ep->dport;
    udp->len = SUBC_HTONS(sizeof(struct udphdr) + clen);
    udp->check = 0;
    if (had_csum) {
        __u64 t = sum;
        t += ip->saddr;
        t += ip->daddr;
        t += SUBC_HTONS(17);
        t += udp->len;
        t += udp->source;
        t += udp->dest;
        t += udp->len;
        __u16 c = ~subc_csum_fold(t);
        udp->check = c ? c : 0xffff;
    }
    subc_count_sub(r, k, data_end - data);
    return k;
#else
    return -1;
#endif
}

/* The tail call target subc_jmp_xdp[1]: the copy of a datagram whose messages go to one subscriber
 * (with one endpoint) or to no one, built in place (subc_repack), sent by XDP_TX or bpf_redirect. */
SUBC_SEC("xdp")
int subc_xdp_one(struct xdp_md *ctx)
{
    __u32 one = 1;
    __u32 *cur_slot = bpf_map_lookup_elem(&subc_cur, &one);
    if (!cur_slot)
        return XDP_DROP;
    __u32 slot = *cur_slot;
    struct subc_dgram *d = bpf_map_lookup_elem(&subc_ring, &slot);
    __u32 cpu = bpf_get_smp_processor_id();
    struct subc_scratch *s = bpf_map_lookup_elem(&subc_scratch, &cpu);
    if (!d || !s)
        return XDP_DROP;
    __u32 r = d->one & (SUBC_LOCAL - 1);
    struct subc_sub *sub = bpf_map_lookup_elem(&subc_subs, &r);
    if (!sub || sub->count != 1)
        goto err;
    __u32 e = sub->ep[0];
    struct subc_endpoint *ep = bpf_map_lookup_elem(&subc_eps, &e);
    if (!ep || subc_repack(ctx, d, s, ep, r, 0, slot) < 0)
        goto err;
    subc_count(SUBC_STAT_XDP_UNICAST);
    if (ep->ifindex == ctx->ingress_ifindex)
        return XDP_TX;
    return bpf_redirect(ep->ifindex, 0);
err:
    subc_count(SUBC_STAT_ERRORS);
    return XDP_DROP;
}

/* The tail call target subc_jmp_xdp[2]: XDP fan-out (dataplane/ebpf/fanout.py).  The datagram's recipient
 * endpoints (every endpoint for a heartbeat) are listed in its ring slot; when they share one
 * interface (a group) the frame is broadcast over that group's device map of exactly that many
 * entries (FAN_LIST: one clone per recipient), else over the map of every endpoint (FAN_ALL: one
 * clone per endpoint, those of non-recipients dropped by subc_egress) when the endpoints are at
 * most subc_fan_cfg.ratio times the recipients, else TC builds the copies. */
SUBC_SEC("xdp")
int subc_xdp_fan(struct xdp_md *ctx)
{
    __u32 zero = 0, one = 1;
    __u32 *cur_slot = bpf_map_lookup_elem(&subc_cur, &one);
    struct subc_fan_cfg *fc = bpf_map_lookup_elem(&subc_fan_cfg, &zero);
    if (!cur_slot || !fc)
        return XDP_DROP;
    __u32 slot = *cur_slot;
    struct subc_dgram *d = bpf_map_lookup_elem(&subc_ring, &slot);
    if (!d)
        return XDP_DROP;
    int hb = SUBC_HEARTBEAT_OR_END(d);
    __u32 g = d->root >> 31;
    struct subc_set *everyone = bpf_map_lookup_elem(&subc_all, &g);
    if (hb && (!everyone || everyone->local))
        return subc_to_tc(ctx, d, slot);
    /* the recipients (d->any; every subscriber for a heartbeat), as the egress programs read them */
    if (hb)
        for (int w = 0; w < SUBC_SUB_WORDS; w++)
            d->any[w] = everyone->subs[w];
    /* nr, group and multi start from a value the verifier does not know (fc->pad is 0), so that the
     * loop's paths (endpoint taken or not) are pruned as one */
    __u32 nr = fc->pad & (SUBC_FAN_SLOTS - 1), group = fc->pad, multi = fc->pad;
    __u64 set = fc->pad;
    for (int e = 0; e < SUBC_FAN_SLOTS; e++) {
        if (e >= fc->n_eps)
            break;
        __u32 key = e; /* e itself stays in a register, where the verifier sees it grow */
        struct subc_endpoint *ep = bpf_map_lookup_elem(&subc_eps, &key);
        if (!ep)
            break;
        __u32 r = ep->subscriber & (SUBC_LOCAL - 1);
        if (!((d->any[(r >> 6) & (SUBC_SUB_WORDS - 1)] >> (r & 63)) & 1))
            continue;
        if (nr == 0)
            group = ep->group;
        else
            multi |= ep->group != group;
        d->fan_ep[nr & (SUBC_FAN_SLOTS - 1)] = e;
        d->fan_grp[nr & (SUBC_FAN_SLOTS - 1)] = ep->group;
        set |= 1ull << (e & 63);
        nr = (nr + 1) & 127;
    }
    if (nr == 0) {
        subc_count(SUBC_STAT_DROPPED);
        return XDP_DROP;
    }
    __u32 index, mode;
    __u32 *set_index = 0;
    if (!multi && nr <= SUBC_FAN_SLOTS && group < SUBC_FAN_SLOTS) {
        index = group * SUBC_FAN_SLOTS + nr - 1;
        mode = SUBC_FAN_LIST;
    } else if (fc->all != SUBC_NO_FAN && fc->n_eps == nr) {
        index = fc->all; /* every endpoint is a recipient: the ALL map is the exact set */
        mode = SUBC_FAN_ALL;
    } else if (nr <= SUBC_FAN_SLOTS && (set_index = bpf_map_lookup_elem(&subc_fan_sets, &set))) {
        index = *set_index;
        mode = SUBC_FAN_SET;
        __u32 h = index - SUBC_FAN_SET_BASE; /* for subc fanout's eviction of idle sets */
        __u64 *hits = bpf_map_lookup_elem(&subc_fan_hits, &h);
        if (hits)
            *hits += 1;
    } else {
        /* no map for this recipient set yet: note it for subc fanout, which makes one */
        __u64 *miss = bpf_map_lookup_elem(&subc_fan_miss, &set);
        if (miss) {
            *miss += 1;
        } else {
            __u64 first = 1;
            bpf_map_update_elem(&subc_fan_miss, &set, &first, BPF_ANY);
        }
        subc_count(SUBC_STAT_FAN_SET_MISS);
        if (fc->all != SUBC_NO_FAN && fc->n_eps <= fc->ratio * nr) {
            index = fc->all;
            mode = SUBC_FAN_ALL;
        } else {
            return subc_to_tc(ctx, d, slot);
        }
    }
    void *inner = bpf_map_lookup_elem(&subc_fan, &index);
    if (!inner)
        return subc_to_tc(ctx, d, slot);
    d->fan_n = nr;
    d->fan_group = group;
    for (int w = 0; w < SUBC_FAN_SLOTS / 8; w++)
        ((__u64 *)d->fan_next)[w] = 0;
    if (subc_set_meta(ctx, d, slot, mode)) {
        subc_count(SUBC_STAT_ERRORS);
        return XDP_DROP;
    }
    subc_count(SUBC_STAT_TO_FAN);
    if (mode == SUBC_FAN_SET)
        subc_count(SUBC_STAT_TO_FAN_SET);
    return bpf_redirect_map(inner, 0, BPF_F_BROADCAST);
}

/* ---- Devmap egress: the fan-out's copies ---------------------------------------------------- */

/* The fan-out's copy builder: the program of every entry of the fan-out device maps, run by the
 * kernel on each clone of a broadcast datagram before it is sent.  The kernel runs one program for
 * all the frames a CPU queues to one device before a flush (the first frame's: kernel/bpf/devmap.c
 * bq_enqueue), so a clone does not know its entry: the k-th clone of a datagram to a group's
 * interface serves the k-th recipient of the list (FAN_LIST), or the group's k-th endpoint
 * (FAN_ALL: dropped when it is no recipient).  Then that recipient's copy: the datagram rewritten
 * whole when every message is for it (and for heartbeats), else repacked (subc_repack).  A frame
 * without fan-out metadata passes unchanged. */
SUBC_SEC("xdp/devmap")
int subc_egress(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *data_end = (void *)(long)ctx->data_end;
    struct subc_meta *m = (void *)(long)ctx->data_meta;
    if ((void *)(m + 1) > data || m->magic != SUBC_META_MAGIC || m->mode == SUBC_FAN_TC)
        return XDP_PASS;
    __u32 slot = m->slot;
    struct subc_dgram *d = bpf_map_lookup_elem(&subc_ring, &slot);
    __u32 cpu = bpf_get_smp_processor_id();
    struct subc_scratch *s = bpf_map_lookup_elem(&subc_scratch, &cpu);
    if (!d || !s)
        goto err;
    if (d->tag != m->tag) {
        subc_count(SUBC_STAT_SLOT_LOST);
        return XDP_DROP;
    }
    __u32 e;
    if (m->mode == SUBC_FAN_ALL) {
        __u32 ifindex = ctx->egress_ifindex;
        __u32 *gp = bpf_map_lookup_elem(&subc_fan_dev, &ifindex);
        if (!gp)
            goto err;
        __u32 g = *gp & (SUBC_FAN_SLOTS - 1);
        __u32 k = d->fan_next[g];
        d->fan_next[g] = k + 1;
        __u32 gi = g * SUBC_FAN_SLOTS + (k & (SUBC_FAN_SLOTS - 1));
        __u32 *ep_index = bpf_map_lookup_elem(&subc_fan_geps, &gi);
        if (!ep_index || k >= SUBC_FAN_SLOTS)
            goto err;
        e = *ep_index;
    } else if (m->mode == SUBC_FAN_SET) {
        /* the k-th clone on this interface serves the datagram's k-th recipient endpoint on it */
        __u32 ifindex = ctx->egress_ifindex;
        __u32 *gp = bpf_map_lookup_elem(&subc_fan_dev, &ifindex);
        if (!gp)
            goto err;
        __u32 g = *gp & (SUBC_FAN_SLOTS - 1);
        __u32 k = d->fan_next[g];
        d->fan_next[g] = k + 1;
        __u32 found = SUBC_FAN_SLOTS, seen = 0;
        for (int i = 0; i < SUBC_FAN_SLOTS; i++) {
            if (i >= d->fan_n)
                break;
            if (d->fan_grp[i] != g)
                continue;
            if (seen == k) {
                found = i;
                break;
            }
            seen++;
        }
        if (found >= SUBC_FAN_SLOTS)
            goto err;
        e = d->fan_ep[found];
    } else {
        __u32 k = d->fan_next[0];
        d->fan_next[0] = k + 1;
        if (k >= d->fan_n || k >= SUBC_FAN_SLOTS)
            goto err;
        e = d->fan_ep[k & (SUBC_FAN_SLOTS - 1)];
    }
    struct subc_endpoint *ep = bpf_map_lookup_elem(&subc_eps, &e);
    if (!ep)
        goto err;
    __u32 r = ep->subscriber & (SUBC_LOCAL - 1);
    if (m->mode == SUBC_FAN_ALL && !((d->any[(r >> 6) & (SUBC_SUB_WORDS - 1)] >> (r & 63)) & 1)) {
        subc_count(SUBC_STAT_FAN_SKIPPED);
        return XDP_DROP;
    }
    if (d->n == 0 || ((d->every[(r >> 6) & (SUBC_SUB_WORDS - 1)] >> (r & 63)) & 1)) {
        /* r takes every message (or a heartbeat): the whole datagram, addresses and sequence
         * number rewritten */
        __u32 k = d->n;
        struct subc_jrec *j = 0;
        __u64 seq = subc_fan_seq(r, k, slot, d->tag, &j);
        if (subc_rewrite(data, data_end, d->l3, d->l4, ep, seq) < 0) {
            subc_jnl_commit_xdp(j, ctx, s, r, k, 0, 0); /* nothing to journal: discarded, counted */
            goto err;
        }
        subc_jnl_commit_xdp(j, ctx, s, r, k, (d->l4 & 0x1ff) + 8, d->plen);
        subc_count_sub(r, k, data_end - data);
    } else if (subc_repack(ctx, d, s, ep, r, 1, slot) < 0) {
        goto err;
    }
    subc_count(SUBC_STAT_FAN_COPIES);
    return XDP_PASS;
err:
    subc_count(SUBC_STAT_ERRORS);
    return XDP_DROP;
}
#endif /* SUBC_FANOUT_H */
