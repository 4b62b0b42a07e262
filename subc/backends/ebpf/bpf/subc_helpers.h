/* subc_helpers.h: counters, sequence numbers, incremental checksums and the network headers'
 * parser shared by the XDP and TC programs. */
#ifndef SUBC_HELPERS_H
#define SUBC_HELPERS_H

#if SUBC_MOLD
#define SUBC_HEARTBEAT_OR_END(d) ((d)->count == SUBC_HEARTBEAT || (d)->count == SUBC_END_OF_SESSION)
#else
#define SUBC_HEARTBEAT_OR_END(d) 0
#endif

static __always_inline void subc_count(__u32 stat)
{
    __u64 *c = bpf_map_lookup_elem(&subc_stats, &stat);
    if (c)
        *c += 1;
}

static __always_inline void subc_count_n(__u32 stat, __u64 n)
{
    __u64 *c = bpf_map_lookup_elem(&subc_stats, &stat);
    if (c)
        *c += n;
}

static __always_inline void subc_count_sub(__u32 r, __u64 messages, __u64 bytes)
{
    struct subc_sub_counter *c = bpf_map_lookup_elem(&subc_sub_cnt, &r);
    if (c) {
        c->datagrams += 1;
        c->messages += messages;
        c->bytes += bytes;
    }
}

/* Sequence number of a recipient's next copy of n messages (its next number advances by n). */
static __always_inline __u64 subc_next_seq(__u32 r, __u32 n)
{
    __u64 *s = bpf_map_lookup_elem(&subc_seq, &r);
    if (!s)
        return 0;
    if (n == 0)
        return *s;
    return __sync_fetch_and_add(s, (__u64)n);
}

/* Incremental checksum update, RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m'). */
static __always_inline __u16 subc_csum_fold(__u64 s)
{
    s = (s & 0xffffffff) + (s >> 32);
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    return (__u16)s;
}

static __always_inline void subc_csum_replace4(__u16 *sum, __u32 from, __u32 to)
{
    __u32 s = (__u16) ~*sum;
    s += (__u16) ~(from & 0xffff);
    s += (__u16) ~(from >> 16);
    s += (to & 0xffff) + (to >> 16);
    *sum = (__u16)~subc_csum_fold(s);
}

static __always_inline void subc_csum_replace2(__u16 *sum, __u16 from, __u16 to)
{
    __u32 s = (__u16) ~*sum;
    s += (__u16)~from;
    s += to;
    *sum = (__u16)~subc_csum_fold(s);
}

/* Parse Ethernet, VLAN, IPv4 and UDP of a frame.  Returns SUBC_NOT_OURS (not a datagram to a feed
 * port: pass it on), SUBC_MALFORMED (a datagram to a feed port with a bad length), or SUBC_OURS
 * with d->l3, d->l4, d->vlan, d->plen set and *dport the destination port. */
static __always_inline int subc_network(void *data, void *data_end, struct subc_dgram *d, __u16 *dport)
{
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > data_end)
        return SUBC_NOT_OURS;
    __u32 off = sizeof(struct ethhdr);
    __u16 proto = eth->h_proto;
    d->vlan = 0;
    if (proto == SUBC_HTONS(ETH_P_8021Q) || proto == SUBC_HTONS(ETH_P_8021AD)) {
        struct subc_vlan_hdr *vh = data + off;
        if ((void *)(vh + 1) > data_end)
            return SUBC_NOT_OURS;
        proto = vh->proto;
        off += sizeof(struct subc_vlan_hdr);
        d->vlan = 1;
    }
    if (proto != SUBC_HTONS(ETH_P_IP))
        return SUBC_NOT_OURS;
    struct iphdr *ip = data + off;
    if ((void *)(ip + 1) > data_end)
        return SUBC_NOT_OURS;
    if (ip->version != 4 || ip->ihl < 5 || (ip->frag_off & SUBC_HTONS(0x3fff)) || ip->protocol != 17 /* UDP */)
        return SUBC_NOT_OURS;
    d->l3 = off;
    __u32 ip_len = SUBC_HTONS(ip->tot_len);
    off += ip->ihl * 4;
    struct udphdr *udp = data + off;
    if ((void *)(udp + 1) > data_end)
        return SUBC_NOT_OURS;
    *dport = SUBC_HTONS(udp->dest);
    if (SUBC_NOT_FEED_PORT(*dport))
        return SUBC_NOT_OURS;
    d->l4 = off;
    __u32 udp_len = SUBC_HTONS(udp->len);
    if (udp_len < sizeof(struct udphdr) || d->l3 + ip_len < off + udp_len || data + off + udp_len > data_end)
        return SUBC_MALFORMED;
    d->plen = udp_len - sizeof(struct udphdr);
    return SUBC_OURS;
}

#endif /* SUBC_HELPERS_H */
