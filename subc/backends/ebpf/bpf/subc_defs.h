/* subc_defs.h: the constants of subc's eBPF program that no rule set or spec changes (the ones that
 * do are in the generated subc_config.h).  Those marked with a Python path are shared with subc's map
 * writers in Python and must change with them. */
#ifndef SUBC_DEFS_H
#define SUBC_DEFS_H

#define SUBC_GEN_BIT 0x80000000u
#define SUBC_STATE_MASK 0x7fffffffu
#define SUBC_UNDECODED 0xffffffffu
#define SUBC_NO_SET 0xffffffffu
/* The slot of a (tagged) state in an array map indexed by state: generation 0 from the bottom,
 * generation 1 from the top (dataplane/ebpf/install.py state_slot). */
#define SUBC_SLOT(state, cap) (((state)&SUBC_GEN_BIT) ? (cap)-1 - ((state)&SUBC_STATE_MASK) : (state))
#define SUBC_SINGLE_UNSET 0xffffffffu
#define SUBC_SINGLE_NONE 0xfffffffeu
#define SUBC_MOLD_HEADER 20 /* MoldUDP64 downstream header bytes: session 10, sequence 8, count 2 */
#define SUBC_HEARTBEAT 0    /* MoldUDP64 message counts that carry no message */
#define SUBC_END_OF_SESSION 0xffff
#ifndef SUBC_MAX_MSGS
#define SUBC_MAX_MSGS 512 /* messages per datagram (a 1,500-byte datagram holds at most 484) */
#endif
#ifndef SUBC_MSGS_PER_PROG
#define SUBC_MSGS_PER_PROG 16 /* 16 x (1 + 33 tail calls) = 544 >= SUBC_MAX_MSGS */
#endif
#ifndef SUBC_SUBS_PER_PROG
#define SUBC_SUBS_PER_PROG 2 /* copies per TC program run (bounded by the verifier's 1M-instruction limit) */
#endif
#define SUBC_MAX_RCPT (SUBC_SUBS_PER_PROG * 32) /* 33 tail calls: one to the first copy run */
#define SUBC_PAYLOAD_MAX 4096                   /* UDP payload bytes of a datagram the copy builder takes */
#define SUBC_BUF 8192                           /* buffers twice SUBC_PAYLOAD_MAX: masked offset + masked length fit */
#ifndef SUBC_SLOTS
#define SUBC_SLOTS 256 /* ring slots per CPU between XDP and TC */
#endif
#ifndef SUBC_JOURNAL
#define SUBC_JOURNAL 0 /* the journal feed (subc_journal.h): subc load --journal sets it */
#endif
#ifndef SUBC_JOURNAL_PAGES
#define SUBC_JOURNAL_PAGES 4096 /* the journal ring buffer's 4 KiB pages (a power of 2) */
#endif
#define SUBC_JREC_INLINE 248 /* journal record: payload bytes held in the record (a 256-byte record) */
/* Benchmark builds only (bench/ebpf_bench.py --breakdown): classify with the first SUBC_BENCH_STAGES
 * field stages (a message then ends at an inner state, which no subscriber has); with
 * SUBC_BENCH_NO_NOTE, record each message's state without its leaf's subscribers and counters. */
#ifndef SUBC_BENCH_STAGES
#define SUBC_BENCH_STAGES 0x7fffffff
#endif
#ifndef SUBC_NCPU
#define SUBC_NCPU 1
#endif

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SUBC_HTONS(x) ((__u16)__builtin_bswap16((__u16)(x)))
#define SUBC_HTONL(x) ((__u32)__builtin_bswap32((__u32)(x)))
#define SUBC_HTONLL(x) ((__u64)__builtin_bswap64((__u64)(x)))
#else
#define SUBC_HTONS(x) ((__u16)(x))
#define SUBC_HTONL(x) ((__u32)(x))
#define SUBC_HTONLL(x) ((__u64)(x))
#endif

enum subc_verdict { SUBC_NOT_OURS = 0, SUBC_OURS = 1, SUBC_MALFORMED = 2 };

#endif /* SUBC_DEFS_H */
