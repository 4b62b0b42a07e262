/* subc_cluster.h: what a broker of a cluster (subc serve --cluster, which needs the journal feed)
 * adds to the data path: its fence, the feed's position, and root switches scheduled at feed
 * positions (README, "Brokers on several hosts").
 *
 * Fence: subc_fence[0] is the time (bpf_ktime_get_ns, CLOCK_MONOTONIC) until which this broker may
 * send copies, pushed forward by its daemon on every renewal of its etcd lease and set short of
 * the lease's end.  Past it (the daemon died, or lost etcd's quorum) every recipient is
 * journal-only and heartbeats go nowhere: a broker whose lease may have ended never sends, so two
 * brokers never deliver one subscriber's stream.  0: no fence.
 *
 * Position: subc_pos (per CPU) holds the feed's session and the sequence number after the
 * highest message seen (a heartbeat's number itself), with the time it was seen; the daemon reads
 * it to choose the position a change takes effect at.
 *
 * Schedule: a change takes effect at a feed position (session, sequence number) recorded in etcd,
 * the same on every broker, so that every broker computes the same stream for every subscriber.
 * subc_sched holds up to SUBC_SCHED root switches not yet reached, sorted by position: a datagram
 * of the same session numbered at or past an entry's position, or of another session, is
 * classified with that entry's root (the last such entry), else with subc_root's.  The table is
 * read and written under its spin lock (user space writes it whole with BPF_F_LOCK), so a
 * datagram sees one version of it.  Brokers that are not a cluster's (the table's "on" word 0) skip
 * all of this. */
#ifndef SUBC_CLUSTER_H
#define SUBC_CLUSTER_H

#if SUBC_JOURNAL && SUBC_MOLD
static __always_inline int subc_fenced(void)
{
    __u32 zero = 0;
    __u64 *until = bpf_map_lookup_elem(&subc_fence, &zero);
    return until && *until && bpf_ktime_get_ns() > *until;
}

/* The root datagram h (its MoldUDP64 header checked present; count messages) is classified
 * with, from the schedule and subc_root's base; records the feed's position. */
static __always_inline __u32 subc_sched_root(__u8 *h, __u32 count, __u32 base)
{
    __u32 zero = 0;
    struct subc_sched *t = bpf_map_lookup_elem(&subc_sched, &zero);
    if (!t || !t->on) /* not a cluster's broker: nothing to track */
        return base;
    __u64 s0 = 0, seq = 0;
    __u16 s1 = 0;
    __builtin_memcpy(&s0, h, 8);
    __builtin_memcpy(&s1, h + 8, 2);
    __builtin_memcpy(&seq, h + 10, 8);
    seq = SUBC_HTONLL(seq);
    struct subc_pos *p = bpf_map_lookup_elem(&subc_pos, &zero);
    if (p) {
        __u64 next = seq + (count == SUBC_END_OF_SESSION ? 0 : count);
        if (p->s0 != s0 || p->s1 != s1 || next > p->next) {
            p->s0 = s0;
            p->s1 = s1;
            p->next = next;
        }
        p->ts = bpf_ktime_get_ns();
    }
    __u32 root = base;
    bpf_spin_lock(&t->lock);
    __u32 n = t->n;
    for (int i = 0; i < SUBC_SCHED; i++) {
        if (i >= n)
            break;
        struct subc_sched_entry *e = &t->e[i];
        if (e->s0 == s0 && e->s1 == s1 && seq < e->seq)
            break;
        root = e->root;
    }
    bpf_spin_unlock(&t->lock);
    return root;
}
#else
static __always_inline int subc_fenced(void)
{
    return 0;
}
static __always_inline __u32 subc_sched_root(__u8 *h, __u32 count, __u32 base)
{
    return base;
}
#endif /* SUBC_JOURNAL && SUBC_MOLD */

#endif /* SUBC_CLUSTER_H */
