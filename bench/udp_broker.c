/* The user-space baseline of bench/broker_throughput.py: a pub/sub broker on UDP sockets that
 * classifies each message with the same compiled tables as the eBPF target (maps.json, flattened
 * by bench/udp_tables.py) and sends one copy per endpoint, with batched recvmmsg/sendmmsg.
 *
 *   udp_broker classify TABLES PAYLOADS          per payload: leaf state, kind, endpoints (tests)
 *   udp_broker broker TABLES BIND_IP PORT SECONDS BATCH   (SECONDS 0: until SIGTERM; prints counters)
 *   udp_broker publish PAYLOADS DST_IP PORT SECONDS BATCH RATE SEGMENTS
 *
 * PAYLOADS: records of a 2-byte big-endian length and a UDP payload (MoldUDP64 packets).  The
 * classifier is the one of templates/ebpf/subc_filter.bpf.c.j2 on the UDP payload: the spec's
 * message parse states (extract, select), then one lookup per field stage (range: binary search
 * of the state's sorted lower bounds; exact: hash of (state, value), else the state's miss
 * target; lpm: longest of the state's prefixes), then the leaf.  Every access is bounds-checked.
 * Not part of subc: a benchmark baseline, built by the harness with `cc -O2`.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#define MAX_INST 32
#define MAX_PSTATES 64
#define MAX_CASES 64
#define MAX_STAGES 64
#define MAX_BATCH 1024
#define MAX_PAYLOAD 2048
#define ACCEPT (-1)
#define REJECT (-2)

static void die(const char *msg)
{
    fprintf(stderr, "udp_broker: %s\n", msg);
    exit(2);
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
    t->slots = calloc(cap, sizeof(struct slot));
    if (!t->slots)
        die("out of memory");
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
struct leaf { int kind; int n_ep; int *ep; }; /* kind 0 drop, 1 pass, 2 fwd */

static int n_inst, inst_bytes[MAX_INST];
static uint32_t net_valid, need_valid, root_state;
static int first_state, n_pstates, n_stages, n_leaves, n_eps;
static struct pstate pstates[MAX_PSTATES];
static struct stage stages[MAX_STAGES];
static struct table leaf_index;
static struct leaf *leaves;
static struct sockaddr_in *eps;

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
    if (rd() != 1)
        die("tables file version");
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
        for (int j = 0; j < p->n_extract; j++)
            p->extract[j] = rd();
        p->sel_inst = rds();
        p->sel_off = rd(), p->sel_bytes = rd(), p->sel_shift = rd(), p->sel_width = rd();
        p->n_cases = rd();
        if (p->n_cases > MAX_CASES)
            die("too many select cases");
        for (int j = 0; j < p->n_cases; j++) {
            p->cases[j].is_default = rd();
            p->cases[j].value = rd();
            p->cases[j].target = rds();
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
        uint64_t n = rd();
        table_init(&s->info, n);
        if (s->kind == 0) {
            read_spans(&s->info, n);
            uint64_t nb = rd();
            s->bounds = calloc(nb + 1, sizeof(struct bound));
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
            s->prefixes = calloc(np + 1, sizeof(struct prefix));
            for (uint64_t j = 0; j < np; j++) {
                s->prefixes[j].value = rd();
                s->prefixes[j].plen = rd();
                s->prefixes[j].next = rd();
            }
        }
    }
    expect("endpoints");
    n_eps = rd();
    eps = calloc(n_eps + 1, sizeof(*eps));
    for (int i = 0; i < n_eps; i++) {
        char ip[64];
        if (fscanf(tf, "%63s", ip) != 1)
            die("bad endpoint");
        eps[i].sin_family = AF_INET;
        if (inet_pton(AF_INET, ip, &eps[i].sin_addr) != 1)
            die("bad endpoint address");
        eps[i].sin_port = htons(rd());
    }
    expect("leaves");
    n_leaves = rd();
    leaves = calloc(n_leaves + 1, sizeof(struct leaf));
    table_init(&leaf_index, n_leaves);
    for (int i = 0; i < n_leaves; i++) {
        uint32_t st = rd();
        leaves[i].kind = rd();
        leaves[i].n_ep = rd();
        leaves[i].ep = calloc(leaves[i].n_ep + 1, sizeof(int));
        for (int j = 0; j < leaves[i].n_ep; j++) {
            leaves[i].ep[j] = rd();
            if (leaves[i].ep[j] >= n_eps)
                die("leaf endpoint out of range");
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

/* The leaf state of a UDP payload of len bytes, or -1 for a default-leaf miss handled as state 0. */
static uint32_t classify(const uint8_t *msg, uint32_t len)
{
    uint32_t off[MAX_INST] = {0};
    uint32_t valid = net_valid, cur = 0;
    int st = first_state;
    for (int steps = 0; st >= 0 && steps < MAX_PSTATES; steps++) {
        const struct pstate *p = &pstates[st];
        int trunc = 0;
        for (int j = 0; j < p->n_extract; j++) {
            int in = p->extract[j];
            off[in] = cur;
            cur += inst_bytes[in];
            if (cur > len) {
                trunc = 1;
                break;
            }
            valid |= 1u << in;
        }
        if (trunc)
            break;
        if (p->sel_inst < 0) {
            st = p->cases[0].target;
            continue;
        }
        uint32_t at = off[p->sel_inst] + p->sel_off;
        if (at + p->sel_bytes > len)
            break;
        uint64_t k = field(msg + at, p->sel_bytes, p->sel_shift, p->sel_width);
        int next = REJECT;
        for (int j = 0; j < p->n_cases; j++)
            if (p->cases[j].is_default || p->cases[j].value == k) {
                next = p->cases[j].target;
                break;
            }
        st = next;
    }
    uint32_t state = root_state;
    if ((valid & need_valid) != need_valid)
        state = 0;
    for (int i = 0; i < n_stages && state; i++) {
        const struct stage *s = &stages[i];
        uint32_t at = off[s->inst] + s->off;
        if (at + s->bytes > len)
            return 0;
        uint64_t v = field(msg + at, s->bytes, s->shift, s->width), x;
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
    if (!table_get(&leaf_index, state, 0, &i))
        return NULL;
    return &leaves[i];
}

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
    *lens = calloc(n + 1, sizeof(uint32_t));
    uint8_t *out = malloc(size + 1);
    long w = 0, at = 0;
    for (int i = 0; i < n; i++) {
        uint32_t l = buf[at] << 8 | buf[at + 1];
        if (at + 2 + l > (unsigned long)size)
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

static int cmd_classify(int argc, char **argv)
{
    if (argc != 4)
        die("usage: classify TABLES PAYLOADS");
    read_tables(argv[2]);
    uint32_t *lens;
    int n;
    uint8_t *p = read_payloads(argv[3], &lens, &n);
    for (int i = 0; i < n; i++) {
        uint32_t st = classify(p, lens[i]);
        const struct leaf *lf = leaf_of(st);
        printf("%u %d", st, lf ? lf->kind : -1);
        if (lf)
            for (int j = 0; j < lf->n_ep; j++)
                printf(" %d", lf->ep[j]);
        printf("\n");
        p += lens[i];
    }
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
    static uint8_t bufs[MAX_BATCH][MAX_PAYLOAD];
    static struct iovec riov[MAX_BATCH];
    static struct mmsghdr rmsg[MAX_BATCH];
    int max_out = MAX_BATCH * 64;
    struct iovec *tiov = calloc(max_out, sizeof(*tiov));
    struct mmsghdr *tmsg = calloc(max_out, sizeof(*tmsg));
    for (int i = 0; i < batch; i++) {
        riov[i].iov_base = bufs[i];
        riov[i].iov_len = MAX_PAYLOAD;
        rmsg[i].msg_hdr.msg_iov = &riov[i];
        rmsg[i].msg_hdr.msg_iovlen = 1;
    }
    uint64_t received = 0, sent = 0, matched = 0, send_errors = 0, passed = 0;
    double end = now() + seconds;
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    while (!stop && (seconds <= 0 || now() < end)) {
        int n = recvmmsg(rx, rmsg, batch, 0, NULL);
        if (n <= 0)
            continue;
        received += n;
        int out = 0;
        for (int i = 0; i < n; i++) {
            const struct leaf *lf = leaf_of(classify(bufs[i], rmsg[i].msg_len));
            if (!lf || lf->kind == 0)
                continue;
            if (lf->kind == 1) {
                passed++;
                continue;
            }
            matched++;
            for (int j = 0; j < lf->n_ep && out < max_out; j++, out++) {
                tiov[out].iov_base = bufs[i];
                tiov[out].iov_len = rmsg[i].msg_len;
                tmsg[out].msg_hdr.msg_iov = &tiov[out];
                tmsg[out].msg_hdr.msg_iovlen = 1;
                tmsg[out].msg_hdr.msg_name = &eps[lf->ep[j]];
                tmsg[out].msg_hdr.msg_namelen = sizeof(struct sockaddr_in);
            }
        }
        for (int at = 0; at < out;) {
            int chunk = out - at > MAX_BATCH ? MAX_BATCH : out - at;
            int k = sendmmsg(tx, tmsg + at, chunk, 0);
            if (k <= 0) {
                send_errors++;
                at++;
                continue;
            }
            sent += k;
            at += k;
        }
    }
    printf("{\"received\": %" PRIu64 ", \"matched\": %" PRIu64 ", \"passed\": %" PRIu64
           ", \"sent\": %" PRIu64 ", \"send_errors\": %" PRIu64 "}\n",
           received, matched, passed, sent, send_errors);
    return 0;
}

/* Send the payloads round-robin for SECONDS: sendmmsg of BATCH datagrams per call, at RATE
 * datagrams/s (0: as fast as possible).  SEGMENTS > 1 sends that many equal-sized payloads per
 * datagram with UDP GSO (UDP_SEGMENT, Linux 4.18), which the kernel splits into datagrams. */
static int cmd_publish(int argc, char **argv)
{
    if (argc != 9)
        die("usage: publish PAYLOADS DST_IP PORT SECONDS BATCH RATE SEGMENTS");
    uint32_t *lens;
    int n;
    uint8_t *p = read_payloads(argv[2], &lens, &n);
    double seconds = atof(argv[5]), rate = atof(argv[7]);
    int batch = atoi(argv[6]), segs = atoi(argv[8]);
    if (n < 1 || batch < 1 || batch > MAX_BATCH || segs < 1 || segs > 64)
        die("no payloads, or batch or segments out of range");
    int s = udp_socket();
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[4]))};
    if (inet_pton(AF_INET, argv[3], &a.sin_addr) != 1 || connect(s, (void *)&a, sizeof(a)))
        die("cannot connect");
    if (segs > 1) {
        for (int i = 1; i < n; i++)
            if (lens[i] != lens[0])
                die("UDP GSO needs payloads of one size");
        int gso = lens[0];
        if (setsockopt(s, SOL_UDP, UDP_SEGMENT, &gso, sizeof(gso)))
            die("UDP_SEGMENT not supported");
    }
    /* one contiguous copy of the payloads, repeated so that any window of segs fits */
    uint32_t size = 0;
    for (int i = 0; i < n; i++)
        size += lens[i];
    uint8_t *ring = malloc(2 * size + 1);
    memcpy(ring, p, size);
    memcpy(ring + size, p, size);
    uint32_t *start = calloc(n, sizeof(uint32_t));
    for (int i = 1; i < n; i++)
        start[i] = start[i - 1] + lens[i - 1];
    static struct iovec iov[MAX_BATCH];
    static struct mmsghdr msg[MAX_BATCH];
    uint64_t sent = 0, errors = 0;
    int next = 0;
    double t0 = now(), end = t0 + seconds, t;
    while ((t = now()) < end) {
        if (rate > 0 && sent > (t - t0) * rate) {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
            continue;
        }
        for (int i = 0; i < batch; i++) {
            uint32_t len = 0;
            for (int k = 0; k < segs; k++)
                len += lens[(next + k) % n];
            iov[i].iov_base = ring + start[next];
            iov[i].iov_len = len;
            msg[i].msg_hdr.msg_iov = &iov[i];
            msg[i].msg_hdr.msg_iovlen = 1;
            next = (next + segs) % n;
        }
        int k = sendmmsg(s, msg, batch, 0);
        if (k < 0)
            errors++;
        else
            sent += (uint64_t)k * segs;
    }
    printf("{\"sent\": %" PRIu64 ", \"errors\": %" PRIu64 ", \"seconds\": %.6f}\n", sent, errors, now() - t0);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        die("usage: udp_broker classify|broker|publish ...");
    if (!strcmp(argv[1], "classify"))
        return cmd_classify(argc, argv);
    if (!strcmp(argv[1], "broker"))
        return cmd_broker(argc, argv);
    if (!strcmp(argv[1], "publish"))
        return cmd_publish(argc, argv);
    die("unknown command");
    return 2;
}
