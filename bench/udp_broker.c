/* The user-space baseline of bench/broker_throughput.py: a pub/sub broker on UDP sockets that does
 * what the eBPF broker does (docs/ebpf.md "Delivery semantics"), with batched recvmmsg/sendmmsg.
 *
 *   udp_broker classify TABLES PAYLOADS     per message: leaf state, leaf kind, subscriber ids (tests)
 *   udp_broker repack TABLES PAYLOADS       per payload: the copies it gives (tests), see cmd_repack
 *   udp_broker broker TABLES BIND_IP PORT SECONDS BATCH   (SECONDS 0: until SIGTERM; prints counters)
 *   udp_broker publish PAYLOADS DST_IP PORT SECONDS BATCH RATE   (RATE: messages/s, 0: at once)
 *
 * PAYLOADS: records of a 2-byte big-endian length and a UDP payload.  TABLES: the compiled rule
 * set flattened by bench/udp_tables.py from maps.json (the same tables the eBPF program loads).
 *
 * Classification is that of templates/ebpf/subc_filter.bpf.c.j2: a MoldUDP64 datagram's header
 * and blocks must agree with its bytes (else it is malformed and dropped); each message is parsed
 * by the spec's message states as the one message of a datagram (its block preceded by the
 * datagram's 20-byte header), a known type whose length differs from the message's, or one the
 * parser rejects or that is cut, is undecoded (sent nowhere); then one lookup per field stage
 * (range: binary search of the state's sorted lower bounds; exact: hash of (state, value), else
 * the state's miss target; lpm: longest of the state's prefixes) leads to the leaf: its
 * subscribers, or the local stack (nop), or nothing.  Each subscriber of at least one message
 * gets one datagram holding exactly its messages in order, each with its 2-byte length, the
 * session unchanged, the count of its messages and its own gap-free sequence number (from 1,
 * advancing by the count); heartbeats and end of session go to every subscriber with its next
 * number.  The kernel writes IPv4/UDP lengths and checksums of what the sockets send.  A spec
 * without MoldUDP64 framing: one message per datagram, sent whole to each subscriber.
 * Limits as the eBPF broker: more than 512 messages, or a payload of 4,096 bytes or more, is too
 * big (counted, passed to the local stack, i.e. kept here).
 * Not part of subc: a benchmark baseline, built by the harness with `cc -O2`.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_INST 32
#define MAX_PSTATES 64
#define MAX_CASES 64
#define MAX_STAGES 64
#define MAX_BATCH 1024
#define PAYLOAD_MAX 4096   /* a payload of this many bytes or more is too big (as the eBPF broker) */
#define MAX_MSGS 512       /* messages per datagram (as the eBPF broker) */
#define MOLD_HEADER 20
#define HEARTBEAT 0
#define END_OF_SESSION 0xffff
#define UNDECODED 0xffffffffu
#define ACCEPT (-1)
#define REJECT (-2)

static void die(const char *msg)
{
    fprintf(stderr, "udp_broker: %s\n", msg);
    exit(2);
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p)
        die("out of memory");
    return p;
}

/* ---- open-addressing hash table: (u32 state, u64 value) -> u64 ---- */
struct slot { uint64_t value; uint64_t out; uint32_t state; uint32_t used; };
struct table { struct slot *slots; uint64_t mask; };

static uint64_t mix(uint32_t s, uint64_t v)
{
    uint64_t h = v * 0x9e3779b97f4a7c15ull ^ ((uint64_t)s * 0xc2b2ae3d27d4eb4full);
    h ^= h >> 31;
    return h * 0xff51afd7ed558ccdull;
}

static void table_init(struct table *t, uint64_t n)
{
    uint64_t cap = 16;
    while (cap < 2 * n + 1)
        cap <<= 1;
    t->slots = xcalloc(cap, sizeof(struct slot));
    t->mask = cap - 1;
}

static void table_put(struct table *t, uint32_t s, uint64_t v, uint64_t out)
{
    for (uint64_t i = mix(s, v) & t->mask;; i = (i + 1) & t->mask) {
        struct slot *sl = &t->slots[i];
        if (!sl->used || (sl->state == s && sl->value == v)) {
            sl->used = 1, sl->state = s, sl->value = v, sl->out = out;
            return;
        }
    }
}

static int table_get(const struct table *t, uint32_t s, uint64_t v, uint64_t *out)
{
    for (uint64_t i = mix(s, v) & t->mask;; i = (i + 1) & t->mask) {
        const struct slot *sl = &t->slots[i];
        if (!sl->used)
            return 0;
        if (sl->state == s && sl->value == v) {
            *out = sl->out;
            return 1;
        }
    }
}

/* ---- the compiled pipeline ---- */
struct pcase { int is_default; uint64_t value; int target; };
struct pstate {
    int n_extract, extract[MAX_INST];
    int sel_inst, sel_off, sel_bytes, sel_shift, sel_width;
    int n_cases;
    struct pcase cases[MAX_CASES];
};
struct bound { uint64_t lo; uint32_t next; };
struct prefix { uint64_t value; uint32_t plen, next; };
struct stage {
    int kind; /* 0 range, 1 exact, 2 lpm */
    int inst, off, bytes, shift, width;
    struct table info;   /* state -> (offset << 32 | count), or the miss target */
    struct table exact;  /* (state, value) -> next */
    struct bound *bounds;
    struct prefix *prefixes;
};
struct sub { int id; int n_ep; int *ep; };          /* a subscriber: its endpoints (indexes into eps) */
struct leaf { int kind; int n_sub; int *sub; };     /* kind 0 drop, 1 pass, 2 fwd; subscribers (indexes) */

static int mold, n_inst, inst_bytes[MAX_INST];
static uint32_t net_valid, need_valid, root_state;
static int first_state, n_pstates, n_stages, n_leaves, n_eps, n_subs;
static struct pstate pstates[MAX_PSTATES];
static struct stage stages[MAX_STAGES];
static struct table leaf_index;
static struct leaf *leaves;
static struct sockaddr_in *eps;
static struct sub *subs;

static FILE *tf;
static uint64_t rd(void)
{
    uint64_t x;
    if (fscanf(tf, "%" SCNu64, &x) != 1)
        die("bad tables file");
    return x;
}
static int64_t rds(void)
{
    int64_t x;
    if (fscanf(tf, "%" SCNd64, &x) != 1)
        die("bad tables file");
    return x;
}
static void expect(const char *word)
{
    char buf[64];
    if (fscanf(tf, "%63s", buf) != 1 || strcmp(buf, word))
        die("bad tables file (section order)");
}

/* n lines "state offset count": the state's slice of a bounds or prefix array */
static void read_spans(struct table *t, uint64_t n)
{
    for (uint64_t j = 0; j < n; j++) {
        uint32_t st = rd();
        uint64_t off = rd(), cnt = rd();
        table_put(t, st, 0, off << 32 | cnt);
    }
}

static void read_tables(const char *path)
{
    tf = fopen(path, "r");
    if (!tf)
        die("cannot open tables file");
    expect("subc-udp-tables");
    if (rd() != 2)
        die("tables file version (2 expected)");
    expect("mold");
    mold = rd();
    expect("insts");
    n_inst = rd();
    if (n_inst > MAX_INST)
        die("too many header instances");
    for (int i = 0; i < n_inst; i++)
        inst_bytes[i] = rd();
    expect("valid");
    net_valid = rd();
    need_valid = rd();
    expect("first");
    first_state = rds();
    expect("pstates");
    n_pstates = rd();
    if (n_pstates > MAX_PSTATES)
        die("too many parse states");
    for (int i = 0; i < n_pstates; i++) {
        struct pstate *p = &pstates[i];
        p->n_extract = rd();
        if (p->n_extract > MAX_INST)
            die("too many extracts");
        for (int j = 0; j < p->n_extract; j++) {
            p->extract[j] = rd();
            if (p->extract[j] >= n_inst)
                die("extract of an unknown instance");
        }
        p->sel_inst = rds();
        p->sel_off = rd(), p->sel_bytes = rd(), p->sel_shift = rd(), p->sel_width = rd();
        p->n_cases = rd();
        if (p->n_cases > MAX_CASES || p->n_cases < 1)
            die("bad number of select cases");
        for (int j = 0; j < p->n_cases; j++) {
            p->cases[j].is_default = rd();
            p->cases[j].value = rd();
            p->cases[j].target = rds();
            if (p->cases[j].target >= n_pstates)
                die("select case to an unknown state");
        }
    }
    expect("root");
    root_state = rd();
    expect("stages");
    n_stages = rd();
    if (n_stages > MAX_STAGES)
        die("too many stages");
    for (int i = 0; i < n_stages; i++) {
        struct stage *s = &stages[i];
        s->kind = rd(), s->inst = rd(), s->off = rd(), s->bytes = rd(), s->shift = rd(), s->width = rd();
        if (s->inst >= n_inst || s->bytes < 1 || s->bytes > 8)
            die("bad stage field");
        uint64_t n = rd();
        table_init(&s->info, n);
        if (s->kind == 0) {
            read_spans(&s->info, n);
            uint64_t nb = rd();
            s->bounds = xcalloc(nb + 1, sizeof(struct bound));
            for (uint64_t j = 0; j < nb; j++) {
                s->bounds[j].lo = rd();
                s->bounds[j].next = rd();
            }
        } else if (s->kind == 1) {
            for (uint64_t j = 0; j < n; j++) {
                uint32_t st = rd();
                table_put(&s->info, st, 0, rd());
            }
            uint64_t ne = rd();
            table_init(&s->exact, ne);
            for (uint64_t j = 0; j < ne; j++) {
                uint32_t st = rd();
                uint64_t v = rd();
                table_put(&s->exact, st, v, rd());
            }
        } else {
            /* n states: state offset count; then the prefixes, longest first within a state */
            read_spans(&s->info, n);
            uint64_t np = rd();
            s->prefixes = xcalloc(np + 1, sizeof(struct prefix));
            for (uint64_t j = 0; j < np; j++) {
                s->prefixes[j].value = rd();
                s->prefixes[j].plen = rd();
                s->prefixes[j].next = rd();
            }
        }
    }
    expect("endpoints");
    n_eps = rd();
    eps = xcalloc(n_eps + 1, sizeof(*eps));
    for (int i = 0; i < n_eps; i++) {
        char ip[64];
        if (fscanf(tf, "%63s", ip) != 1)
            die("bad endpoint");
        eps[i].sin_family = AF_INET;
        if (inet_pton(AF_INET, ip, &eps[i].sin_addr) != 1)
            die("bad endpoint address");
        eps[i].sin_port = htons(rd());
    }
    expect("subscribers");
    n_subs = rd();
    subs = xcalloc(n_subs + 1, sizeof(struct sub));
    for (int i = 0; i < n_subs; i++) {
        subs[i].id = rd();
        subs[i].n_ep = rd();
        subs[i].ep = xcalloc(subs[i].n_ep + 1, sizeof(int));
        for (int j = 0; j < subs[i].n_ep; j++) {
            subs[i].ep[j] = rd();
            if (subs[i].ep[j] >= n_eps)
                die("subscriber endpoint out of range");
        }
    }
    expect("leaves");
    n_leaves = rd();
    leaves = xcalloc(n_leaves + 1, sizeof(struct leaf));
    table_init(&leaf_index, n_leaves);
    for (int i = 0; i < n_leaves; i++) {
        uint32_t st = rd();
        leaves[i].kind = rd();
        leaves[i].n_sub = rd();
        leaves[i].sub = xcalloc(leaves[i].n_sub + 1, sizeof(int));
        for (int j = 0; j < leaves[i].n_sub; j++) {
            leaves[i].sub[j] = rd();
            if (leaves[i].sub[j] >= n_subs)
                die("leaf subscriber out of range");
        }
        table_put(&leaf_index, st, 0, i);
    }
    fclose(tf);
}

static inline uint64_t load_be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

static inline uint64_t field(const uint8_t *p, int bytes, int shift, int width)
{
    uint64_t v = load_be(p, bytes) >> shift;
    return width < 64 ? v & ((1ull << width) - 1) : v;
}

/* The leaf state of a message in buf[0, len), or UNDECODED.
 * msg_at > 0 (MoldUDP64 framing): buf is the datagram's 20-byte header, the message's 2-byte
 * length and the message, which starts at msg_at (22); the message is undecoded when the parser
 * rejects it, when a header runs past it, or when a known type (one reached by no default select
 * case on a key inside the message) has another length.  msg_at == 0 (one message per datagram):
 * buf is the UDP payload; a cut message or a reject keeps the headers parsed so far. */
static uint32_t classify(const uint8_t *buf, uint32_t len, uint32_t msg_at)
{
    uint32_t off[MAX_INST] = {0};
    uint32_t valid = net_valid, cur = 0;
    int st = first_state, dflt = 0, steps;
    for (steps = 0; st >= 0 && steps < MAX_PSTATES; steps++) {
        const struct pstate *p = &pstates[st];
        for (int j = 0; j < p->n_extract; j++) {
            int in = p->extract[j];
            off[in] = cur;
            cur += inst_bytes[in];
            if (cur > len) {
                if (msg_at)
                    return UNDECODED;
                goto parsed;
            }
            valid |= 1u << in;
        }
        if (p->sel_inst < 0) {
            st = p->cases[0].target;
            continue;
        }
        uint32_t at = off[p->sel_inst] + p->sel_off;
        if (at + p->sel_bytes > len) {
            if (msg_at)
                return UNDECODED;
            goto parsed;
        }
        uint64_t k = field(buf + at, p->sel_bytes, p->sel_shift, p->sel_width);
        int next = REJECT;
        for (int j = 0; j < p->n_cases; j++) {
            if (p->cases[j].is_default) {
                if (at >= msg_at)
                    dflt = 1;
                next = p->cases[j].target;
                break;
            }
            if (p->cases[j].value == k) {
                next = p->cases[j].target;
                break;
            }
        }
        st = next;
    }
    if (msg_at && (st != ACCEPT || (!dflt && cur != len)))
        return UNDECODED;  /* rejected (or a parser loop), or a known type of another length */
parsed:;
    uint32_t state = root_state;
    if ((valid & need_valid) != need_valid)
        state = 0;
    for (int i = 0; i < n_stages && state; i++) {
        const struct stage *s = &stages[i];
        uint32_t at = off[s->inst] + s->off;
        if (at + s->bytes > len)
            return UNDECODED;
        uint64_t v = field(buf + at, s->bytes, s->shift, s->width), x;
        uint32_t next = 0;
        if (s->kind == 0) {
            if (table_get(&s->info, state, 0, &x)) {
                uint64_t base = x >> 32, n = x & 0xffffffffu;
                while (n > 1) {
                    uint64_t half = n >> 1;
                    if (s->bounds[base + half].lo <= v)
                        base += half;
                    n -= half;
                }
                next = s->bounds[base].next;
            }
        } else if (s->kind == 1) {
            if (table_get(&s->exact, state, v, &x) || table_get(&s->info, state, 0, &x))
                next = x;
        } else if (table_get(&s->info, state, 0, &x)) {
            for (uint64_t j = x >> 32, e = j + (x & 0xffffffffu); j < e; j++) {
                const struct prefix *pr = &s->prefixes[j];
                int drop = s->width - pr->plen;
                if (pr->plen == 0 || (drop >= 64 ? 1 : (v >> drop) == (pr->value >> drop))) {
                    next = pr->next;
                    break;
                }
            }
        }
        state = next;
    }
    return state;
}

static const struct leaf *leaf_of(uint32_t state)
{
    uint64_t i;
    if (state == UNDECODED || !table_get(&leaf_index, state, 0, &i))
        return NULL;
    return &leaves[i];
}

/* The leaf of message block blk (at its 2-byte length; mlen message bytes) of a datagram whose
 * header is hdr: parsed as the one message of a datagram. */
static uint32_t classify_block(const uint8_t *hdr, const uint8_t *blk, uint32_t mlen)
{
    static uint8_t tmp[MOLD_HEADER + 2 + PAYLOAD_MAX];
    memcpy(tmp, hdr, MOLD_HEADER);
    memcpy(tmp + MOLD_HEADER, blk, 2 + mlen);
    return classify(tmp, MOLD_HEADER + 2 + mlen, MOLD_HEADER + 2);
}

/* ---- per-subscriber repacking ---- */
struct copy { int sub; uint8_t *data; uint32_t len, msgs; };
struct counters {
    uint64_t datagrams, malformed, too_big, heartbeats, messages, undecoded, no_match, passed, copies, copy_msgs;
};
static struct counters C;
static uint64_t *next_seq;  /* per subscriber index: its next sequence number, from 1 */
static uint8_t **cbuf;      /* per subscriber index: its copy being built (NULL: none yet) */
static uint32_t *cpos, *ccnt;
static size_t arena_used;  /* arena bytes the last repack used */

static void repack_init(void)
{
    next_seq = xcalloc(n_subs + 1, sizeof(uint64_t));
    for (int i = 0; i < n_subs; i++)
        next_seq[i] = 1;
    cbuf = xcalloc(n_subs + 1, sizeof(uint8_t *));
    cpos = xcalloc(n_subs + 1, sizeof(uint32_t));
    ccnt = xcalloc(n_subs + 1, sizeof(uint32_t));
}

static inline void put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = v & 0xff;
}

/* The copies of the UDP payload p[0, len): written to out[] (at most n_subs), their bytes in
 * arena (at least n_subs * (len + 20) bytes free; arena_used says how many it used); returns the number of copies (0: none),
 * or -1 (malformed: dropped) or -2 (too big: kept).  Advances the subscribers' sequence numbers. */
static int repack(const uint8_t *p, uint32_t len, uint8_t *arena, struct copy *out)
{
    C.datagrams++;
    arena_used = 0;
    if (len >= PAYLOAD_MAX) {
        C.too_big++;
        return -2;
    }
    int nc = 0;
    if (!mold) {
        const struct leaf *lf = leaf_of(classify(p, len, 0));
        C.messages++;
        if (!lf)
            C.undecoded++;
        else if (lf->kind == 1)
            C.passed++;
        else if (lf->kind == 2)
            for (int j = 0; j < lf->n_sub; j++)
                if (subs[lf->sub[j]].n_ep)
                    out[nc++] = (struct copy){lf->sub[j], (uint8_t *)p, len, 1};
        return nc;
    }
    if (len < MOLD_HEADER) {
        C.malformed++;
        return -1;
    }
    uint32_t count = p[18] << 8 | p[19];
    if (count == HEARTBEAT || count == END_OF_SESSION) {
        if (len != MOLD_HEADER) {
            C.malformed++;
            return -1;
        }
        C.heartbeats++;
        for (int s = 0; s < n_subs; s++) {
            if (!subs[s].n_ep)
                continue;
            memcpy(arena, p, MOLD_HEADER);
            put_be64(arena + 10, next_seq[s]);
            out[nc++] = (struct copy){s, arena, MOLD_HEADER, 0};
            arena += MOLD_HEADER;
            arena_used += MOLD_HEADER;
        }
        return nc;
    }
    if (count > MAX_MSGS) {
        C.too_big++;
        return -2;
    }
    /* the blocks must agree with the count and the bytes */
    static uint32_t moff[MAX_MSGS], mlen[MAX_MSGS];
    uint32_t off = MOLD_HEADER;
    for (uint32_t i = 0; i < count; i++) {
        if (off + 2 > len) {
            C.malformed++;
            return -1;
        }
        uint32_t l = p[off] << 8 | p[off + 1];
        if (off + 2 + l > len) {
            C.malformed++;
            return -1;
        }
        moff[i] = off, mlen[i] = l;
        off += 2 + l;
    }
    if (off != len) {
        C.malformed++;
        return -1;
    }
    uint8_t *a = arena;
    for (uint32_t i = 0; i < count; i++) {
        C.messages++;
        uint32_t st = classify_block(p, p + moff[i], mlen[i]);
        const struct leaf *lf = leaf_of(st);
        if (!lf) {
            C.undecoded++;
            continue;
        }
        if (!(st & 0x7fffffffu))
            C.no_match++;
        if (lf->kind == 1)
            C.passed++;
        if (lf->kind != 2)
            continue;
        for (int j = 0; j < lf->n_sub; j++) {
            int s = lf->sub[j];
            if (!subs[s].n_ep)
                continue;  /* as the eBPF broker: a subscriber without endpoints gets no copy */
            if (!cbuf[s]) {
                cbuf[s] = a;
                a += len;
                cpos[s] = MOLD_HEADER;
                ccnt[s] = 0;
            }
            memcpy(cbuf[s] + cpos[s], p + moff[i], 2 + mlen[i]);
            cpos[s] += 2 + mlen[i];
            ccnt[s]++;
        }
    }
    for (int s = 0; s < n_subs; s++) {
        if (!cbuf[s])
            continue;
        uint8_t *c = cbuf[s];
        memcpy(c, p, 10);
        put_be64(c + 10, next_seq[s]);
        c[18] = ccnt[s] >> 8;
        c[19] = ccnt[s] & 0xff;
        next_seq[s] += ccnt[s];
        out[nc++] = (struct copy){s, c, cpos[s], ccnt[s]};
        cbuf[s] = NULL;
    }
    arena_used = a - arena;
    return nc;
}

/* ---- commands ---- */
static uint8_t *read_payloads(const char *path, uint32_t **lens, int *count)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        die("cannot open payloads file");
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(size + 1);
    if (!buf || fread(buf, 1, size, f) != (size_t)size)
        die("cannot read payloads file");
    fclose(f);
    int n = 0;
    for (long at = 0; at + 2 <= size; n++)
        at += 2 + (buf[at] << 8 | buf[at + 1]);
    *lens = xcalloc(n + 1, sizeof(uint32_t));
    uint8_t *out = malloc(size + 1);
    long w = 0, at = 0;
    for (int i = 0; i < n; i++) {
        uint32_t l = buf[at] << 8 | buf[at + 1];
        if (at + 2 + (long)l > size)
            die("truncated payloads file");
        memcpy(out + w, buf + at + 2, l);
        (*lens)[i] = l;
        w += l;
        at += 2 + l;
    }
    free(buf);
    *count = n;
    return out;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* classify: one line per message ("state kind id..."; kind -1: undecoded); a MoldUDP64 payload
 * that is malformed or a heartbeat gives no line. */
static int cmd_classify(int argc, char **argv)
{
    if (argc != 4)
        die("usage: classify TABLES PAYLOADS");
    read_tables(argv[2]);
    uint32_t *lens;
    int n;
    uint8_t *p = read_payloads(argv[3], &lens, &n);
    for (int i = 0; i < n; p += lens[i], i++) {
        uint32_t states[MAX_MSGS], ns = 0;
        if (!mold) {
            states[ns++] = classify(p, lens[i], 0);
        } else if (lens[i] >= MOLD_HEADER) {
            uint32_t count = p[18] << 8 | p[19], off = MOLD_HEADER;
            for (uint32_t k = 0; k < count && k < MAX_MSGS && off + 2 <= lens[i]; k++) {
                uint32_t l = p[off] << 8 | p[off + 1];
                if (off + 2 + l > lens[i] || l > PAYLOAD_MAX)
                    break;
                states[ns++] = classify_block(p, p + off, l);
                off += 2 + l;
            }
        }
        for (uint32_t k = 0; k < ns; k++) {
            const struct leaf *lf = leaf_of(states[k]);
            printf("%u %d", states[k], lf ? lf->kind : -1);
            if (lf)
                for (int j = 0; j < lf->n_sub; j++)
                    printf(" %d", subs[lf->sub[j]].id);
            printf("\n");
        }
    }
    return 0;
}

/* repack: per payload i, one line per copy "i subscriber-id hex-payload", or "i malformed" or
 * "i too_big"; then the counters as JSON on the last line. */
static int cmd_repack(int argc, char **argv)
{
    if (argc != 4)
        die("usage: repack TABLES PAYLOADS");
    read_tables(argv[2]);
    repack_init();
    uint32_t *lens;
    int n;
    uint8_t *p = read_payloads(argv[3], &lens, &n);
    uint8_t *arena = xcalloc((size_t)(n_subs + 1) * (PAYLOAD_MAX + MOLD_HEADER), 1);
    struct copy *out = xcalloc(n_subs + 1, sizeof(struct copy));
    for (int i = 0; i < n; p += lens[i], i++) {
        int nc = repack(p, lens[i], arena, out);
        if (nc == -1)
            printf("%d malformed\n", i);
        else if (nc == -2)
            printf("%d too_big\n", i);
        for (int c = 0; c < nc; c++) {
            printf("%d %d ", i, subs[out[c].sub].id);
            for (uint32_t b = 0; b < out[c].len; b++)
                printf("%02x", out[c].data[b]);
            printf("\n");
        }
    }
    printf("{\"datagrams\": %" PRIu64 ", \"malformed\": %" PRIu64 ", \"too_big\": %" PRIu64 ", \"heartbeats\": %" PRIu64
           ", \"messages\": %" PRIu64 ", \"undecoded\": %" PRIu64 ", \"no_match\": %" PRIu64 ", \"passed\": %" PRIu64 "}\n",
           C.datagrams, C.malformed, C.too_big, C.heartbeats, C.messages, C.undecoded, C.no_match, C.passed);
    return 0;
}

static volatile sig_atomic_t stop;
static void on_term(int sig)
{
    (void)sig;
    stop = 1;
}

static int udp_socket(void)
{
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    if (s < 0)
        die("socket");
    int sz = 64 << 20;
    setsockopt(s, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
    setsockopt(s, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
    setsockopt(s, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof(sz));
    setsockopt(s, SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof(sz));
    return s;
}

static int cmd_broker(int argc, char **argv)
{
    if (argc != 7)
        die("usage: broker TABLES BIND_IP PORT SECONDS BATCH");
    read_tables(argv[2]);
    repack_init();
    double seconds = atof(argv[5]);
    int batch = atoi(argv[6]);
    if (batch < 1 || batch > MAX_BATCH)
        die("batch out of range");
    int rx = udp_socket(), tx = udp_socket();
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[4]))};
    if (inet_pton(AF_INET, argv[3], &a.sin_addr) != 1 || bind(rx, (void *)&a, sizeof(a)))
        die("cannot bind");
    struct timeval tv = {.tv_sec = 0, .tv_usec = 100000};
    setsockopt(rx, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    fprintf(stderr, "udp_broker: listening on %s:%s\n", argv[3], argv[4]);
    fflush(stderr);
    static uint8_t bufs[MAX_BATCH][PAYLOAD_MAX + 1];
    static struct iovec riov[MAX_BATCH];
    static struct mmsghdr rmsg[MAX_BATCH];
    /* copies of up to a whole batch: one arena region and one sendmmsg entry per endpoint */
    size_t arena_cap = (size_t)(n_subs + 1) * (PAYLOAD_MAX + MOLD_HEADER) * 16;
    uint8_t *arena = xcalloc(arena_cap, 1);
    int max_out = MAX_BATCH;
    struct iovec *tiov = xcalloc(max_out, sizeof(*tiov));
    struct mmsghdr *tmsg = xcalloc(max_out, sizeof(*tmsg));
    struct copy *copies = xcalloc(n_subs + 1, sizeof(struct copy));
    for (int i = 0; i < batch; i++) {
        riov[i].iov_base = bufs[i];
        riov[i].iov_len = PAYLOAD_MAX + 1;
        rmsg[i].msg_hdr.msg_iov = &riov[i];
        rmsg[i].msg_hdr.msg_iovlen = 1;
    }
    uint64_t received = 0, sent = 0, sent_msgs = 0, send_errors = 0;
    uint32_t *tmsgs = xcalloc(max_out, sizeof(uint32_t));  /* messages of each queued copy */
    int all_eps = 0;
    for (int s = 0; s < n_subs; s++)
        all_eps += subs[s].n_ep;
    if (all_eps > max_out)
        die("more endpoints than one sendmmsg batch holds");
    double end = now() + seconds;
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    while (!stop && (seconds <= 0 || now() < end)) {
        int n = recvmmsg(rx, rmsg, batch, MSG_WAITFORONE, NULL);
        if (n <= 0)
            continue;
        received += n;
        int out = 0;
        size_t used = 0;
        for (int i = 0; i <= n; i++) {
            /* send what is queued before a datagram whose copies might not fit, and at the end */
            if (i == n || used + (size_t)n_subs * (rmsg[i].msg_len + MOLD_HEADER) > arena_cap ||
                out + all_eps > max_out) {
                for (int at = 0; at < out;) {
                    int k = sendmmsg(tx, tmsg + at, out - at, 0);
                    if (k <= 0) {
                        send_errors++;
                        at++;
                        continue;
                    }
                    for (int j = at; j < at + k; j++)
                        sent_msgs += tmsgs[j];
                    sent += k;
                    at += k;
                }
                out = 0;
                used = 0;
            }
            if (i == n)
                break;
            int nc = repack(bufs[i], rmsg[i].msg_len, arena + used, copies);
            used += arena_used;
            for (int c = 0; c < nc; c++) {
                const struct sub *sb = &subs[copies[c].sub];
                for (int e = 0; e < sb->n_ep; e++, out++) {
                    tiov[out].iov_base = copies[c].data;
                    tiov[out].iov_len = copies[c].len;
                    tmsg[out].msg_hdr.msg_iov = &tiov[out];
                    tmsg[out].msg_hdr.msg_iovlen = 1;
                    tmsg[out].msg_hdr.msg_name = &eps[sb->ep[e]];
                    tmsg[out].msg_hdr.msg_namelen = sizeof(struct sockaddr_in);
                    tmsgs[out] = copies[c].msgs;
                }
            }
        }
    }
    printf("{\"received\": %" PRIu64 ", \"messages\": %" PRIu64 ", \"malformed\": %" PRIu64 ", \"too_big\": %" PRIu64
           ", \"heartbeats\": %" PRIu64 ", \"undecoded\": %" PRIu64 ", \"passed\": %" PRIu64 ", \"sent\": %" PRIu64
           ", \"sent_messages\": %" PRIu64 ", \"send_errors\": %" PRIu64 "}\n",
           received, C.messages, C.malformed, C.too_big, C.heartbeats, C.undecoded, C.passed, sent, sent_msgs,
           send_errors);
    return 0;
}

/* Send the payloads round-robin for SECONDS: sendmmsg of BATCH datagrams per call, at RATE
 * messages/s (MoldUDP64 message counts; 0: as fast as possible). */
static int cmd_publish(int argc, char **argv)
{
    if (argc != 8)
        die("usage: publish PAYLOADS DST_IP PORT SECONDS BATCH RATE");
    uint32_t *lens;
    int n;
    uint8_t *p = read_payloads(argv[2], &lens, &n);
    double seconds = atof(argv[5]), rate = atof(argv[7]);
    int batch = atoi(argv[6]);
    if (n < 1 || batch < 1 || batch > MAX_BATCH)
        die("no payloads, or batch out of range");
    int s = udp_socket();
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[4]))};
    if (inet_pton(AF_INET, argv[3], &a.sin_addr) != 1 || connect(s, (void *)&a, sizeof(a)))
        die("cannot connect");
    uint8_t **start = xcalloc(n, sizeof(uint8_t *));
    uint32_t *msgs = xcalloc(n, sizeof(uint32_t));
    for (int i = 0; i < n; i++) {
        start[i] = i ? start[i - 1] + lens[i - 1] : p;
        uint32_t c = lens[i] >= MOLD_HEADER ? (start[i][18] << 8 | start[i][19]) : 1;
        msgs[i] = c == END_OF_SESSION ? 0 : c;
    }
    static struct iovec iov[MAX_BATCH];
    static struct mmsghdr msg[MAX_BATCH];
    static uint32_t bmsgs[MAX_BATCH];
    uint64_t sent = 0, sent_msgs = 0, errors = 0;
    int next = 0;
    double t0 = now(), end = t0 + seconds, t;
    while ((t = now()) < end) {
        if (rate > 0 && sent_msgs > (t - t0) * rate) {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
            continue;
        }
        for (int i = 0; i < batch; i++) {
            iov[i].iov_base = start[next];
            iov[i].iov_len = lens[next];
            msg[i].msg_hdr.msg_iov = &iov[i];
            msg[i].msg_hdr.msg_iovlen = 1;
            bmsgs[i] = msgs[next];
            next = (next + 1) % n;
        }
        int k = sendmmsg(s, msg, batch, 0);
        if (k < 0) {
            errors++;
            next = (next - batch + n) % n;  /* resend the same ones */
            continue;
        }
        next = (next - (batch - k) + n) % n;
        sent += k;
        for (int i = 0; i < k; i++)
            sent_msgs += bmsgs[i];
    }
    printf("{\"sent\": %" PRIu64 ", \"messages\": %" PRIu64 ", \"errors\": %" PRIu64 ", \"seconds\": %.6f}\n", sent,
           sent_msgs, errors, now() - t0);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        die("usage: udp_broker classify|repack|broker|publish ...");
    if (!strcmp(argv[1], "classify"))
        return cmd_classify(argc, argv);
    if (!strcmp(argv[1], "repack"))
        return cmd_repack(argc, argv);
    if (!strcmp(argv[1], "broker"))
        return cmd_broker(argc, argv);
    if (!strcmp(argv[1], "publish"))
        return cmd_publish(argc, argv);
    die("unknown command");
    return 2;
}
