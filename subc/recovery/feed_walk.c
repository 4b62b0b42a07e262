/* feed_walk.c: the journal feed's fast path (subc/recovery/journal_feed.py): walk the records of
 * the data plane's journal ring buffer (subc/backends/ebpf/bpf/subc_journal.h) and turn each copy
 * that continues its recipient's stream into SoupBinTCP 4.1 Sequenced Data packets in that
 * recipient's output buffer.  Everything else -- a record out of sequence order, a payload in a
 * record of its own, a lost payload, a recipient the caller handles itself, a malformed record --
 * stops the walk at that record for the caller's own (Python) path, which is the reference; this
 * file only makes the common case fast.  Compiled at first use (subc/recovery/native.py).
 *
 * Ring layout (kernel/bpf/ringbuf.c): records of an 8-byte header (length, with bit 31 while
 * reserved and bit 30 when discarded; page offset) and the record, rounded up to 8 bytes; the data
 * pages are mapped twice in a row, so a record at (pos & mask) reads as one piece. */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define BUSY_BIT (1u << 31)
#define DISCARD_BIT (1u << 30)
#define JREC_HEAD 8
#define JREC_INLINE 248
#define FLAG_PAYLOAD 1
#define FLAG_NEXT 2
#define FLAG_BODY 8
#define MOLD_HEADER 20

/* One recipient's output: next_seq is the sequence number its next copy must carry (0: the walk
 * leaves the recipient's records to the caller); buf takes its packets (len bytes of cap), offs
 * each packet's offset in buf (n of offs_cap); first_seq and session are those of the first
 * packet in buf (set when n is 0).  For subc_feed_write: fd, the journal segment the packets go
 * to (-1: the caller appends them), seg_size its size, seg_room the bytes it may still take and
 * seg_session its session; wrote and err say what became of them. */
struct subc_feed_out {
    uint64_t next_seq;
    uint64_t first_seq;
    uint8_t *buf;
    uint64_t *offs;
    uint32_t cap;
    uint32_t len;
    uint32_t offs_cap;
    uint32_t n;
    uint8_t session[10];
    uint8_t pad[6];
    int32_t fd;
    uint32_t wrote;
    uint64_t seg_size;
    uint64_t seg_room;
    int32_t err;
    uint32_t pad2;
    uint8_t seg_session[10];
    uint8_t pad3[6];
};

enum { WALK_END = 0, WALK_BUSY = 1, WALK_SLOW = 2, WALK_FULL = 3 };

static uint64_t be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

/* Take the copy whose payload (MoldUDP64 header and blocks, plen bytes) is at p for out: 1 taken,
 * 0 for the caller, -1 output full. */
static int take(const uint8_t *p, uint32_t plen, struct subc_feed_out *out)
{
    if (plen < MOLD_HEADER)
        return 0;
    uint64_t seq = be64(p + 10);
    uint32_t count = (p[18] << 8) | p[19];
    if (seq != out->next_seq || count == 0 || count == 0xffff)
        return 0;
    if (out->n && memcmp(out->session, p, 10))
        return 0; /* another session: the caller starts a segment */
    /* the blocks must be exactly count blocks filling the payload */
    uint32_t at = MOLD_HEADER, k = 0;
    while (at + 2 <= plen) {
        uint32_t m = (p[at] << 8) | p[at + 1];
        if (at + 2 + m > plen)
            return 0;
        at += 2 + m;
        k++;
    }
    if (at != plen || k != count)
        return 0;
    if ((uint64_t)out->len + (plen - MOLD_HEADER) + count > out->cap || out->n + count > out->offs_cap)
        return -1;
    if (!out->n) {
        out->first_seq = seq;
        memcpy(out->session, p, 10);
    }
    for (at = MOLD_HEADER; at < plen;) {
        uint32_t m = (p[at] << 8) | p[at + 1];
        uint8_t *o = out->buf + out->len;
        out->offs[out->n++] = out->len;
        o[0] = (m + 1) >> 8;
        o[1] = (m + 1) & 0xff;
        o[2] = 'S';
        memcpy(o + 3, p + at + 2, m);
        out->len += m + 3;
        at += 2 + m;
    }
    out->next_seq = seq + count;
    return 1;
}

static uint32_t u32le(const uint8_t *p)
{
    return p[0] | (p[1] << 8) | (p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t span(uint32_t n)
{
    return (n + 8 + 7) & ~7ull;
}

/* Walk the records from *pos up to prod (data: the ring's data pages, mapped twice; mask: its
 * size - 1), taking what take() takes into outs[recipient] (nouts of them).  *pos ends at the
 * first record not taken; *records counts those passed (discarded ones included).  Returns why
 * it stopped: WALK_END (prod reached), WALK_BUSY (a record still reserved), WALK_SLOW (a record
 * for the caller), WALK_FULL (an output buffer is full). */
int subc_feed_walk(const uint8_t *data, uint64_t mask, uint64_t *pos, uint64_t prod, struct subc_feed_out *outs,
                   uint32_t nouts, uint64_t *records)
{
    uint64_t p = *pos;
    int why = WALK_END;
    while (p < prod) {
        const uint8_t *h = data + (p & mask);
        uint32_t len = __atomic_load_n((const uint32_t *)h, __ATOMIC_ACQUIRE);
        if (len & BUSY_BIT) {
            why = WALK_BUSY;
            break;
        }
        uint32_t n = len & ~(BUSY_BIT | DISCARD_BIT);
        uint64_t step = span(n), taken = 1;
        if (!(len & DISCARD_BIT)) {
            const uint8_t *rec = h + 8;
            uint32_t r = n >= JREC_HEAD ? u32le(rec) : nouts;
            uint32_t plen = n >= JREC_HEAD ? (uint32_t)(rec[4] | (rec[5] << 8)) : 0;
            uint32_t flags = n >= JREC_HEAD ? (uint32_t)(rec[6] | (rec[7] << 8)) : 0;
            if (r >= nouts || !outs[r].next_seq || n < JREC_HEAD + JREC_INLINE) {
                why = WALK_SLOW;
                break;
            }
            int t = 0;
            if (flags == FLAG_PAYLOAD && plen <= JREC_INLINE) {
                t = take(rec + JREC_HEAD, plen, &outs[r]);
            } else if (flags == FLAG_NEXT && p + step < prod) {
                /* the payload record, when it is the next one (one CPU): both taken */
                const uint8_t *bh = data + ((p + step) & mask);
                uint32_t blen = __atomic_load_n((const uint32_t *)bh, __ATOMIC_ACQUIRE);
                const uint8_t *body = bh + 8;
                if (!(blen & (BUSY_BIT | DISCARD_BIT)) && blen >= JREC_HEAD + MOLD_HEADER && u32le(body) == r &&
                    (body[6] | (body[7] << 8)) == FLAG_BODY && (uint32_t)(body[4] | (body[5] << 8)) == plen &&
                    plen + JREC_HEAD <= blen && !memcmp(body + JREC_HEAD + 10, rec + JREC_HEAD + 10, 8)) {
                    t = take(body + JREC_HEAD, plen, &outs[r]);
                    step += span(blen);
                    taken = 2;
                }
            }
            if (t <= 0) {
                why = t < 0 ? WALK_FULL : WALK_SLOW;
                break;
            }
        }
        p += step;
        *records += taken;
    }
    *pos = p;
    return why;
}

/* Append each recipient's packets (outs[r].n > 0) to its journal segment outs[r].fd when they fit
 * in seg_room and their session is the segment's (seg_session): one write (continued after a short one); the packets' offsets become offsets in the
 * segment, seg_size and seg_room advance, wrote = 1.  A write that fails cuts the segment back to
 * where it was (ftruncate: no partial batch stays in it) and sets err (errno); recipients without
 * a segment or room are left as they are (wrote = 0) for the caller.  Returns the recipients
 * written. */
int subc_feed_write(struct subc_feed_out *outs, uint32_t nouts)
{
    int done = 0;
    for (uint32_t r = 0; r < nouts; r++) {
        struct subc_feed_out *o = &outs[r];
        o->wrote = 0;
        o->err = 0;
        if (!o->n || o->fd < 0 || o->len > o->seg_room || memcmp(o->session, o->seg_session, 10))
            continue;
        uint32_t at = 0;
        while (at < o->len) {
            ssize_t w = write(o->fd, o->buf + at, o->len - at);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                o->err = w < 0 ? errno : EIO;
                break;
            }
            at += (uint32_t)w;
        }
        if (o->err) {
            if (at && ftruncate(o->fd, (off_t)o->seg_size) < 0 && !o->err)
                o->err = errno;
            continue;
        }
        for (uint32_t i = 0; i < o->n; i++)
            o->offs[i] += o->seg_size;
        o->seg_size += o->len;
        o->seg_room -= o->len;
        o->wrote = 1;
        done++;
    }
    return done;
}
