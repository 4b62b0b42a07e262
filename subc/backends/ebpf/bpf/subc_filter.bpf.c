/* subc_filter.bpf.c: subc's eBPF data path (XDP + TC), a content-based pub/sub broker in the kernel.
 *
 * Static C: what depends on the rule set or the spec is in the two headers subc compiles beside
 * it, subc_config.h (the variant, constants, map capacities and layouts, the field stages' maps)
 * and subc_classify.h (the spec's parser and the stage walk).  Compiled by bcc at load time
 * (subc load, subc serve), or as an object by clang -target bpf -DSUBC_LIBBPF (subc_compat.h).
 *
 * Data path (docs/ebpf.md "Delivery semantics"): XDP parses Ethernet (one optional
 * 802.1Q/802.1ad tag), IPv4 (options skipped by IHL, fragments passed), UDP to a feed port, then
 *
 * - SUBC_MOLD: every message of the MoldUDP64 datagram: each is parsed by the spec's message
 *   states and classified on its own by walking one BPF map per field (the sliced BDD: state ->
 *   next state) to its leaf, whose subscriber set (512 bits) says who gets it.
 *   SUBC_MSGS_PER_PROG messages are classified per program run, then the program tail-calls itself
 *   (bounded loops the verifier checks once per run; at most 33 tail calls).  Each recipient gets
 *   one datagram holding exactly its messages in order, with its own gap-free MoldUDP64 sequence
 *   number (subc_seq): XDP rewrites and redirects the datagram itself when it goes whole to one
 *   endpoint; otherwise XDP leaves its per-message results in a ring slot named in the XDP
 *   metadata, and each recipient's copy is built either by a devmap egress program (XDP fan-out,
 *   when the broker is attached in driver mode with at most SUBC_FAN_SLOTS endpoints: one
 *   bpf_redirect_map(BPF_F_BROADCAST) over a device map of the recipients' slots, the kernel
 *   cloning the frame per entry; dataplane/ebpf/fanout.py) or by TC (SUBC_SUBS_PER_PROG recipients per
 *   run, then a tail call), sent by bpf_clone_redirect.
 * - otherwise: the spec's message headers (one message per datagram), walks one BPF map per field
 *   to the leaf, and sends the datagram whole to each subscriber of the leaf (XDP for one
 *   endpoint, TC clones for several), or passes it to the local stack, or drops it.
 *
 * Map keys carry the rule-set generation in bit 31; subc_root holds the root state of the live
 * generation, read once per datagram, so one map write switches rule sets atomically.
 */
#include "subc_compat.h"
#include "subc_defs.h"
#include "subc_config.h"
#include "subc_types.h"
#include "subc_maps.h"
#include "subc_helpers.h"
#include "subc_cluster.h"
#include "subc_journal.h"
#include "subc_classify.h"
#include "subc_xdp.h"
#include "subc_fanout.h"
#include "subc_tc.h"
