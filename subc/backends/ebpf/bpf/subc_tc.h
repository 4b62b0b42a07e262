/* subc_tc.h: the TC program subc_tc: one copy per recipient of a datagram XDP handed over. */
#ifndef SUBC_TC_H
#define SUBC_TC_H

/* Write the headers of a copy of clen payload bytes for endpoint ep (NULL: the local stack, the
 * datagram's own addresses): Ethernet addresses, IPv4 total length, addresses and checksum, UDP
 * destination, length and checksum (sum: the payload's partial sum; none when the datagram had
 * none).  Returns 0 or -1. */
static __always_inline int subc_write_headers(struct __sk_buff *skb, struct subc_dgram *d, struct subc_scratch *s,
                                              struct subc_endpoint *ep, __u32 clen, __u32 sum)
{
    __u32 l4 = d->l4 & 0x7f;
    __u32 ihl = l4 - ETH_HLEN;
    if (d->l3 != ETH_HLEN || ihl < 20 || ihl > 60 || (ihl & 3))
        return -1;
    __u64 hb[11] = {}; /* Ethernet at byte 2, so that the IPv4 header is 4-byte aligned */
    __u8 *h = (__u8 *)hb + 2;
    __builtin_memcpy(h, s->hdr, 80);
    struct udphdr u = s->udph;
    struct ethhdr *eth = (void *)h;
    struct iphdr *ip = (void *)(h + ETH_HLEN);
    if (ep) {
        __builtin_memcpy(eth->h_dest, ep->dmac, 6);
        __builtin_memcpy(eth->h_source, ep->smac, 6);
        ip->saddr = ep->saddr;
        ip->daddr = ep->daddr;
        u.dest = ep->dport;
    }
    ip->tot_len = SUBC_HTONS(ihl + 8 + clen);
    ip->check = 0;
    __s64 ic = bpf_csum_diff(0, 0, (void *)ip, ihl & 0x3c, 0);
    if (ic < 0)
        return -1;
    ip->check = ~subc_csum_fold((__u64)ic);
    u.len = SUBC_HTONS(8 + clen);
    u.check = 0;
    if (s->csum) {
        __u64 t = sum;
        t += ip->saddr;
        t += ip->daddr;
        t += SUBC_HTONS(17);
        t += u.len;
        t += u.source;
        t += u.dest;
        t += u.len;
        __u16 c = ~subc_csum_fold(t);
        u.check = c ? c : 0xffff;
    }
    if (bpf_skb_store_bytes(skb, 0, h, ETH_HLEN + (ihl & 0x3c), 0))
        return -1;
    if (bpf_skb_store_bytes(skb, l4, &u, sizeof(u), 0))
        return -1;
    return 0;
}

/* Build recipient r's payload in s->copy (header with its sequence number, then its messages)
 * and put it in the skb.  Returns the copy's messages, or -1. */
static __always_inline int subc_build_copy(struct __sk_buff *skb, struct subc_dgram *d, struct subc_scratch *s, __u32 r,
                                           __u32 *clen_out, __u32 *sum_out, int journal_only)
{
    /* pos and k start from values the verifier does not know (s->zero is 0), so that the states of
     * the loop's two paths (message taken or not) are equivalent and pruned: linear, not quadratic */
    __u32 pos = (s->zero + SUBC_MOLD_HEADER) & (SUBC_PAYLOAD_MAX - 1);
    __u32 k = s->zero & 1023;
#if SUBC_MOLD
    __u32 word = (r >> 6) & (SUBC_SUB_WORDS - 1);
    __u64 bit = 1ull << (r & 63);
    for (int i = 0; i < SUBC_MAX_MSGS; i++) {
        if (i >= d->n)
            break;
        int take;
        if (r == SUBC_LOCAL)
            take = s->local_msg[i];
        else
            take = (s->subs[i][word] & bit) != 0;
        if (!take)
            continue;
        __u32 off = d->msg[i].off & (SUBC_PAYLOAD_MAX - 1);
        __u32 n = (d->msg[i].len + 2) & (SUBC_PAYLOAD_MAX - 1);
        /* the messages lie within the payload (< SUBC_PAYLOAD_MAX bytes): pos + n never wraps */
        bpf_probe_read_kernel(&s->copy[pos & (SUBC_PAYLOAD_MAX - 1)], n, &s->orig[off]);
        pos = (pos + n) & (SUBC_PAYLOAD_MAX - 1);
        k = (k + 1) & 1023;
    }
    __u32 count = d->n ? k : d->count;
    struct subc_jrec *j = subc_jnl_reserve(r, k); /* before the number is taken: subc_journal.h */
    __u64 seq = subc_next_seq(r < SUBC_LOCAL ? r : SUBC_LOCAL, k);
    __builtin_memcpy(s->copy, s->orig, 10);
    __u64 bseq = SUBC_HTONLL(seq);
    __builtin_memcpy(&s->copy[10], &bseq, 8);
    s->copy[18] = count >> 8;
    s->copy[19] = count & 0xff;
#else
    pos = d->plen & (SUBC_PAYLOAD_MAX - 1);
    k = 1;
    if (pos)
        bpf_probe_read_kernel(s->copy, pos, s->orig);
#endif
    __u32 clen = pos & (SUBC_PAYLOAD_MAX - 1);
#if SUBC_MOLD
    subc_jnl_commit(j, s, r, k, clen); /* journaled as built, before it is sent */
#endif
    if (journal_only) {
        *clen_out = clen;
        return k;
    }
    /* zero padding to a multiple of 4 bytes for the checksum */
    s->copy[clen & (SUBC_BUF - 1)] = 0;
    s->copy[(clen + 1) & (SUBC_BUF - 1)] = 0;
    s->copy[(clen + 2) & (SUBC_BUF - 1)] = 0;
    __u32 padded = (clen + 3) & ~3u;
    __u32 sum = 0;
    if (s->csum) {
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
    __u32 l4 = d->l4 & 0x7f;
    if (bpf_skb_change_tail(skb, l4 + 8 + clen, 0))
        return -1;
    if (clen < 1 || bpf_skb_store_bytes(skb, l4 + 8, s->copy, clen, 0))
        return -1;
    *clen_out = clen;
    *sum_out = sum;
    return k;
}

static __always_inline int subc_tc_copies(struct __sk_buff *skb, struct subc_dgram *d, struct subc_scratch *s)
{
    for (int j = 0; j < SUBC_SUBS_PER_PROG; j++) {
        __u32 q = s->next;
        if (q >= s->nr)
            break;
        s->next = q + 1;
        __u32 r = s->rcpt[q & (SUBC_MAX_RCPT - 1)] & (SUBC_LOCAL - 1);
        struct subc_sub *sub = bpf_map_lookup_elem(&subc_subs, &r);
        if (!sub)
            continue;
        __u32 clen = 0, sum = 0;
        int marked = subc_jnl_only_has(r);        /* marked journal-only, or past the fence */
        int journal_only = !sub->count || marked; /* its copy is journaled, not sent */
        if (journal_only && !marked)
            continue;
        int k = subc_build_copy(skb, d, s, r, &clen, &sum, journal_only);
        if (k < 0) {
            subc_count(SUBC_STAT_ERRORS);
            continue;
        }
        if (journal_only) {
            subc_count_sub(r, k, clen);
            continue;
        }
        for (int e = 0; e < SUBC_MAX_ENDPOINTS; e++) {
            if (e >= sub->count)
                break;
            __u32 ei = sub->ep[e];
            struct subc_endpoint *ep = bpf_map_lookup_elem(&subc_eps, &ei);
            if (!ep || subc_write_headers(skb, d, s, ep, clen, sum) < 0) {
                subc_count(SUBC_STAT_ERRORS);
                continue;
            }
            if (q + 1 == s->nr && e + 1 == sub->count && !s->local) {
                /* the last copy: the packet itself (no clone) */
                subc_count(SUBC_STAT_TC_CLONES);
                subc_count_sub(r, k, skb->len);
                return bpf_redirect(ep->ifindex, 0);
            }
            if (bpf_clone_redirect(skb, ep->ifindex, 0) == 0) {
                subc_count(SUBC_STAT_TC_CLONES);
                subc_count_sub(r, k, skb->len);
            } else {
                subc_count(SUBC_STAT_ERRORS);
            }
        }
    }
    if (s->next < s->nr) {
        bpf_tail_call(skb, &subc_jmp_tc, 0);
        subc_count(SUBC_STAT_ERRORS); /* the tail call failed */
        return TC_ACT_SHOT;
    }
    if (!s->local)
        return TC_ACT_SHOT;
    __u32 clen = 0, sum = 0;
    int k = subc_build_copy(skb, d, s, SUBC_LOCAL, &clen, &sum, 0);
    if (k < 0 || subc_write_headers(skb, d, s, 0, clen, sum) < 0) {
        subc_count(SUBC_STAT_ERRORS);
        return TC_ACT_SHOT;
    }
    subc_count(SUBC_STAT_PASSED_LOCAL);
    subc_count_sub(SUBC_LOCAL, k, skb->len);
    return TC_ACT_OK;
}

/* TC ingress: build the copies of the datagrams XDP handed over in the metadata; everything else
 * passes.  (Every datagram to a feed port is classified by XDP: the broker attaches both.) */
SUBC_SEC("tc")
int subc_tc(struct __sk_buff *skb)
{
    void *data = (void *)(long)skb->data;
    struct subc_meta *m = (void *)(long)skb->data_meta;
    if ((void *)(m + 1) > data || m->magic != SUBC_META_MAGIC)
        return TC_ACT_OK;
    __u32 slot = m->slot, tag = m->tag;
    struct subc_dgram *d = bpf_map_lookup_elem(&subc_ring, &slot);
    __u32 cpu = bpf_get_smp_processor_id();
    struct subc_scratch *s = bpf_map_lookup_elem(&subc_scratch, &cpu);
    if (!d || !s)
        return TC_ACT_SHOT;
    if (d->tag != tag) {
        subc_count(SUBC_STAT_SLOT_LOST);
        return TC_ACT_SHOT;
    }
    subc_count(SUBC_STAT_TC_PACKETS);
    if (skb->vlan_present)
        bpf_skb_vlan_pop(skb);
    __u32 l4 = d->l4 & 0x7f;
    __u32 plen = d->plen & (SUBC_PAYLOAD_MAX - 1);
    if (d->l3 != ETH_HLEN || l4 > sizeof(s->hdr) || l4 < ETH_HLEN + 20 || d->plen > SUBC_PAYLOAD_MAX - 1 || plen < 1) {
        subc_count(SUBC_STAT_ERRORS);
        return TC_ACT_SHOT;
    }
    if (bpf_skb_load_bytes(skb, 0, s->hdr, l4) || bpf_skb_load_bytes(skb, l4, &s->udph, sizeof(s->udph)) ||
        bpf_skb_load_bytes(skb, l4 + 8, s->orig, plen)) {
        subc_count(SUBC_STAT_ERRORS);
        return TC_ACT_SHOT;
    }
    s->csum = s->udph.check != 0;
    s->slot = slot;
    s->zero = 0;
    /* each message's subscribers (and whether it goes to the local stack) */
    for (int i = 0; i < SUBC_MAX_MSGS; i++) {
        if (i >= d->n)
            break;
        __u32 st = d->msg[i].leaf;
        __u32 lslot = SUBC_SLOT(st, SUBC_CAP_SUBC_LEAF);
        struct subc_leaf *lf = st == SUBC_UNDECODED ? 0 : bpf_map_lookup_elem(&subc_leaf, &lslot);
        if (lf) {
            __builtin_memcpy(s->subs[i], lf->subs, sizeof(lf->subs));
            s->local_msg[i] = lf->flags & SUBC_LEAF_PASS_LOCAL;
        } else {
            __builtin_memset(s->subs[i], 0, sizeof(s->subs[i]));
            s->local_msg[i] = 0;
        }
    }
    /* the recipients: the messages' subscribers, or everyone for a heartbeat */
    __u64 want[SUBC_SUB_WORDS];
    int hb = SUBC_HEARTBEAT_OR_END(d);
    __u32 g = d->root >> 31;
    struct subc_set *everyone = bpf_map_lookup_elem(&subc_all, &g);
    for (int w = 0; w < SUBC_SUB_WORDS; w++)
        want[w] = hb ? (everyone ? everyone->subs[w] : 0) : d->any[w];
    __u32 nr = 0;
    for (int w = 0; w < SUBC_SUB_WORDS; w++) {
        __u64 x = want[w];
        if (!x)
            continue;
        for (int b = 0; b < 64; b++) {
            /* branch-free append: a slot written past the end is overwritten by the next one */
            s->rcpt[nr & (SUBC_MAX_RCPT - 1)] = w * 64 + b;
            nr = (nr + ((x >> b) & 1)) & 1023;
        }
    }
    if (nr > SUBC_MAX_RCPT)
        subc_count_n(SUBC_STAT_FANOUT_OVERFLOW, nr - SUBC_MAX_RCPT);
    s->nr = nr < SUBC_MAX_RCPT ? nr : SUBC_MAX_RCPT;
    s->next = 0;
    s->local = d->pass_any || (hb && everyone && everyone->local);
    bpf_tail_call(skb, &subc_jmp_tc, 0);
    subc_count(SUBC_STAT_ERRORS); /* the tail call failed */
    return TC_ACT_SHOT;
}

/* The tail call target of subc_tc (subc_jmp_tc[0]): the next recipients of the same datagram. */
SUBC_SEC("tc")
int subc_tc_more(struct __sk_buff *skb)
{
    __u32 cpu = bpf_get_smp_processor_id();
    struct subc_scratch *s = bpf_map_lookup_elem(&subc_scratch, &cpu);
    if (!s)
        return TC_ACT_SHOT;
    __u32 slot = s->slot;
    struct subc_dgram *d = bpf_map_lookup_elem(&subc_ring, &slot);
    if (!d)
        return TC_ACT_SHOT;
    return subc_tc_copies(skb, d, s);
}
#endif /* SUBC_TC_H */
