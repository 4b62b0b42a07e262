/* subc_maps.h: the static program's maps (the field stages' maps are in subc_config.h).  Names
 * are what subc's map writers and `subc stats` look them up by (maps.json); docs/ebpf.md "Maps". */
#ifndef SUBC_MAPS_H
#define SUBC_MAPS_H

SUBC_ARRAY(subc_root, __u32, 1);
#if SUBC_STATE
SUBC_ARRAY(subc_upd, struct subc_umask,
           SUBC_CAP_SUBC_UPD); /* state at the first state-value stage -> instances it updates */
SUBC_ARRAY(subc_agg, struct subc_agg, SUBC_CAP_SUBC_AGG); /* instance k: slot k (generation 0), SUBC_CAP - 1 - k (1) */
#endif
SUBC_ARRAY(subc_leaf, struct subc_leaf, SUBC_CAP_SUBC_LEAF);
#if SUBC_COUNTERS
SUBC_ARRAY(subc_cnt, struct subc_cmask,
           SUBC_CAP_SUBC_CNT); /* leaf state -> the named counters' updates its message applies */
#endif
SUBC_ARRAY(subc_leaf_set, struct subc_set, SUBC_CAP_SUBC_LEAF_SET);
SUBC_ARRAY(subc_subs, struct subc_sub, SUBC_CAP_SUBC_SUBS);
SUBC_ARRAY(subc_all, struct subc_set, 2); /* per generation: every subscriber, the local stack */
SUBC_ARRAY(subc_eps, struct subc_endpoint, SUBC_CAP_SUBC_EPS);
SUBC_ARRAY(subc_seq, __u64, SUBC_RECIPIENTS);
SUBC_PERCPU_ARRAY(subc_stats, __u64, SUBC_N_STATS);
SUBC_PERCPU_ARRAY(subc_sub_cnt, struct subc_sub_counter, SUBC_RECIPIENTS);
SUBC_PERCPU_ARRAY(subc_leaf_cnt, struct subc_counter, SUBC_CAP_SUBC_LEAF_CNT);
SUBC_PROG_ARRAY(subc_jmp_xdp,
                3); /* a prog array serves one program type: [0] subc_xdp_more, [1] subc_xdp_one, [2] subc_xdp_fan */
SUBC_PROG_ARRAY(subc_jmp_tc, 1);
SUBC_ARRAY(subc_fan_cfg, struct subc_fan_cfg, 1);
SUBC_HASH(subc_fan_dev, __u32, __u32, SUBC_FAN_SLOTS);            /* ifindex -> group (its endpoints' interface) */
SUBC_ARRAY(subc_fan_geps, __u32, SUBC_FAN_SLOTS *SUBC_FAN_SLOTS); /* group * SUBC_FAN_SLOTS + k -> its k-th endpoint */
SUBC_DEVMAP(subc_fan_tpl, SUBC_FAN_SLOTS);                        /* the inner maps' template */
#define SUBC_FAN_SET_BASE \
    (SUBC_FAN_SLOTS * SUBC_FAN_SLOTS + 1) /* first FAN_SET map in subc_fan (after the LIST and ALL maps) */
SUBC_DEVMAP_ARRAY(subc_fan, SUBC_FAN_SET_BASE + SUBC_FAN_SETS, SUBC_FAN_SLOTS);
SUBC_HASH(subc_fan_sets, __u64, __u32, SUBC_FAN_SETS); /* recipient endpoints (bit e) -> its FAN_SET map in subc_fan */
SUBC_HASH(subc_fan_miss, __u64, __u64, SUBC_FAN_MISSES); /* recipient endpoints without a FAN_SET map -> datagrams */
SUBC_PERCPU_ARRAY(subc_fan_hits, __u64,
                  SUBC_FAN_SETS); /* datagrams sent over each FAN_SET map (its subc_fan index - SUBC_FAN_SET_BASE) */
SUBC_PERCPU_ARRAY(subc_seq_res, struct subc_seq_res, SUBC_RECIPIENTS);
SUBC_ARRAY(subc_ring, struct subc_dgram, SUBC_NCPU *SUBC_SLOTS);
SUBC_PERCPU_ARRAY(subc_cur, __u32, 2); /* [0] datagram counter, [1] slot of the datagram in XDP */
SUBC_ARRAY(subc_scratch, struct subc_scratch, SUBC_NCPU);
#if SUBC_JOURNAL && SUBC_MOLD
SUBC_RINGBUF(subc_jnl, SUBC_JOURNAL_PAGES);               /* the journal feed (subc_journal.h) */
SUBC_PERCPU_ARRAY(subc_jnl_lost, __u64, SUBC_RECIPIENTS); /* per recipient: messages sent but not journaled */
SUBC_ARRAY(subc_jnl_only, struct subc_set, 1);   /* recipients whose copies are journaled, not sent (no endpoint) */
SUBC_ARRAY(subc_fence, __u64, 1);                /* deliver until (bpf_ktime_get_ns), 0: always (subc_cluster.h) */
SUBC_PERCPU_ARRAY(subc_pos, struct subc_pos, 1); /* the feed's position (subc_cluster.h) */
SUBC_ARRAY(subc_sched, struct subc_sched, 1);    /* root switches at feed positions (subc_cluster.h) */
#endif

#endif /* SUBC_MAPS_H */
