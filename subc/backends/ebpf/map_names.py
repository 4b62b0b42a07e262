"""The names of the eBPF program's maps: one constant per map that ``bpf/subc_maps.h`` declares, as
``maps.json`` lists them and as the map writers (:mod:`subc.dataplane.ebpf`) and ``subc stats``
open them.  ``tests/test_ebpf_source.py`` checks :data:`STATIC_MAPS` against the C declarations.
The field stages' maps are named per stage (``st<i>_info``, ``st<i>_bnd``, ``st<i>_ex``,
``st<i>_lpm``; :mod:`.target`); the state-value stages share three (:data:`SV_INFO`,
:data:`SV_BOUNDS`, :data:`SV_BASE`), declared by ``subc_config.h`` when the rules compare state."""

ROOT = "subc_root"  # the live generation's root state
UPD = "subc_upd"  # state -> the aggregate instances a message updates
AGG = "subc_agg"  # aggregate registers, two generations
LEAF = "subc_leaf"  # leaf state -> action, subscribers
CNT = "subc_cnt"  # leaf state -> named-counter updates
LEAF_SET = "subc_leaf_set"  # leaf state -> subscriber set
SUBS = "subc_subs"  # subscriber -> its endpoints
ALL = "subc_all"  # per generation: every subscriber, the local stack
EPS = "subc_eps"  # endpoint -> addresses, interface
SEQ = "subc_seq"  # recipient -> its next MoldUDP64 sequence number
STATS = "subc_stats"  # per-CPU counters (layout.STATS)
SUB_CNT = "subc_sub_cnt"  # per-CPU per-recipient datagrams, messages, bytes
LEAF_CNT = "subc_leaf_cnt"  # per-CPU per-leaf messages, bytes
JMP_XDP = "subc_jmp_xdp"  # XDP tail calls
JMP_TC = "subc_jmp_tc"  # TC tail calls
FAN_CFG = "subc_fan_cfg"  # XDP fan-out configuration
FAN_DEV = "subc_fan_dev"  # ifindex -> fan-out group
FAN_GEPS = "subc_fan_geps"  # group's k-th endpoint
FAN_TPL = "subc_fan_tpl"  # the inner device maps' template
FAN = "subc_fan"  # the fan-out's device maps
FAN_SETS = "subc_fan_sets"  # recipient endpoints -> FAN_SET map
FAN_MISS = "subc_fan_miss"  # recipient endpoints without a FAN_SET map -> datagrams
FAN_HITS = "subc_fan_hits"  # datagrams per FAN_SET map
SEQ_RES = "subc_seq_res"  # per-CPU sequence number a recipient's copy took
RING = "subc_ring"  # XDP-to-TC ring of datagrams
CUR = "subc_cur"  # per-CPU datagram counter and current slot
SCRATCH = "subc_scratch"  # TC's per-CPU scratch
JNL = "subc_jnl"  # the journal feed's ring buffer (with SUBC_JOURNAL)
JNL_LOST = "subc_jnl_lost"  # per-CPU per-recipient messages sent but not journaled (with SUBC_JOURNAL)
JNL_ONLY = "subc_jnl_only"  # the recipients whose copies are journaled, not sent (with SUBC_JOURNAL)
FENCE = "subc_fence"  # deliver until this time (CLOCK_MONOTONIC ns; 0: always), then journal only (with SUBC_JOURNAL)
POS = "subc_pos"  # per-CPU: the feed's session and next sequence number (with SUBC_JOURNAL)
SCHED = "subc_sched"  # root switches scheduled at feed positions (with SUBC_JOURNAL)
SV_INFO = "subc_sv_info"  # state-value stages: (stage base + state) -> bounds offset and count, or next state
SV_BOUNDS = "subc_sv_bnd"  # state-value stages: their bounds
SV_BASE = "subc_sv_base"  # per generation: each state-value stage's base in SV_INFO

STATIC_MAPS = (
    ROOT,
    UPD,
    AGG,
    LEAF,
    CNT,
    LEAF_SET,
    SUBS,
    ALL,
    EPS,
    SEQ,
    STATS,
    SUB_CNT,
    LEAF_CNT,
    JMP_XDP,
    JMP_TC,
    FAN_CFG,
    FAN_DEV,
    FAN_GEPS,
    FAN_TPL,
    FAN,
    FAN_SETS,
    FAN_MISS,
    FAN_HITS,
    SEQ_RES,
    RING,
    CUR,
    SCRATCH,
    JNL,
    JNL_LOST,
    JNL_ONLY,
    FENCE,
    POS,
    SCHED,
)
"""Every map the static program declares (``bpf/subc_maps.h``), in declaration order."""
