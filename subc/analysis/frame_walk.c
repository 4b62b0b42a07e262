/* The BinaryFILE frame walk of subc analyze (splits.py, walk_binaryfile), the hot loop in C.
 *
 * From byte offset pos of d (n bytes), while pos < n - 1: read the 2-byte big-endian length; stop
 * at a zero length (the caller handles the zero-length quirk and the end-of-session marker);
 * else record the message's start (pos + 2) in starts and move pos past the message.  Stops
 * also when cap starts are recorded.  Returns the offset reached; *count gets the starts
 * recorded.  The caller checks what the walk ends on, exactly as its Python loop does. */
#include <stdint.h>

int64_t subc_frame_walk(const uint8_t *d, int64_t n, int64_t pos, int64_t *starts, int64_t cap, int64_t *count)
{
    int64_t k = 0;
    while (pos < n - 1 && k < cap) {
        int64_t length = ((int64_t)d[pos] << 8) | d[pos + 1];
        if (!length)
            break;
        starts[k++] = pos + 2;
        pos += 2 + length;
    }
    *count = k;
    return pos;
}
