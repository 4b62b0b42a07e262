/* subc_compat.h: what differs between the two ways subc's eBPF program is compiled.
 *
 * - bcc (the load path: subc load, subc serve, the tests that run the program): bcc compiles the
 *   program at load time, with its own headers, and creates the maps it declares.  bcc 0.26
 *   (Debian 12) finds a map only through its method syntax (map.lookup, map.update, map.call),
 *   and not inside a macro, so subc's loader rewrites the standard helper calls whose argument is
 *   a map's address (bpf_map_lookup_elem, bpf_map_update_elem with BPF_ANY, bpf_tail_call) into
 *   that syntax (subc/backends/ebpf/source.py, bcc_dialect) before handing bcc the source.
 * - clang -target bpf -DSUBC_LIBBPF (CI, and anyone who builds the program as an object): the
 *   same source as plain C against the kernel's UAPI headers and libbpf's bpf_helpers.h, maps
 *   declared in libbpf's BTF form.
 *
 * Everything else in subc_filter.bpf.c and its headers is the same C for both.
 */
#ifndef SUBC_COMPAT_H
#define SUBC_COMPAT_H

#ifdef SUBC_LIBBPF

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

#define SUBC_SEC(name) SEC(name)
#define SUBC_MAP(name, map_type, key_type, value_type, n) \
    struct {                                              \
        __uint(type, map_type);                           \
        __uint(max_entries, n);                           \
        __type(key, key_type);                            \
        __type(value, value_type);                        \
    } name SEC(".maps")
#define SUBC_ARRAY(name, value_type, n) SUBC_MAP(name, BPF_MAP_TYPE_ARRAY, __u32, value_type, n)
#define SUBC_PERCPU_ARRAY(name, value_type, n) SUBC_MAP(name, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, value_type, n)
#define SUBC_HASH(name, key_type, value_type, n) SUBC_MAP(name, BPF_MAP_TYPE_HASH, key_type, value_type, n)
#define SUBC_PROG_ARRAY(name, n) SUBC_MAP(name, BPF_MAP_TYPE_PROG_ARRAY, __u32, __u32, n)
#define SUBC_LPM_TRIE(name, key_type, value_type, n) \
    struct {                                         \
        __uint(type, BPF_MAP_TYPE_LPM_TRIE);         \
        __uint(max_entries, n);                      \
        __uint(map_flags, BPF_F_NO_PREALLOC);        \
        __type(key, key_type);                       \
        __type(value, value_type);                   \
    } name SEC(".maps")
/* A device map (the template of the fan-out's inner maps), and an array of such maps */
#define SUBC_DEVMAP(name, n) SUBC_MAP(name, BPF_MAP_TYPE_DEVMAP, __u32, struct bpf_devmap_val, n)
#define SUBC_DEVMAP_ARRAY(name, n, inner_n)           \
    struct {                                          \
        __uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);     \
        __uint(max_entries, n);                       \
        __type(key, __u32);                           \
        __array(                                      \
            values, struct {                          \
                __uint(type, BPF_MAP_TYPE_DEVMAP);    \
                __uint(max_entries, inner_n);         \
                __type(key, __u32);                   \
                __type(value, struct bpf_devmap_val); \
            });                                       \
    } name SEC(".maps")

/* A BPF ring buffer of `pages` pages (4 KiB each) */
#define SUBC_RINGBUF(name, pages)           \
    struct {                                \
        __uint(type, BPF_MAP_TYPE_RINGBUF); \
        __uint(max_entries, (pages)*4096);  \
    } name SEC(".maps")

char subc_license[] SEC("license") = "GPL";

#else /* bcc */

#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/udp.h>
#include <uapi/linux/pkt_cls.h>

#define SUBC_SEC(name) /* bcc loads each program by its function name */
#define SUBC_ARRAY(name, value_type, n) BPF_ARRAY(name, value_type, n)
#define SUBC_PERCPU_ARRAY(name, value_type, n) BPF_PERCPU_ARRAY(name, value_type, n)
#define SUBC_HASH(name, key_type, value_type, n) BPF_HASH(name, key_type, value_type, n)
#define SUBC_PROG_ARRAY(name, n) BPF_PROG_ARRAY(name, n)
#define SUBC_LPM_TRIE(name, key_type, value_type, n) BPF_LPM_TRIE(name, key_type, value_type, n)
/* bcc names the inner maps' template by its map name: the device map subc_fan_tpl */
#define SUBC_DEVMAP(name, n) BPF_TABLE("devmap", __u32, struct bpf_devmap_val, name, n)
#define SUBC_DEVMAP_ARRAY(name, n, inner_n) BPF_ARRAY_OF_MAPS(name, "subc_fan_tpl", n)
#define SUBC_RINGBUF(name, pages) BPF_RINGBUF_OUTPUT(name, pages)

#endif /* SUBC_LIBBPF */

#endif /* SUBC_COMPAT_H */
