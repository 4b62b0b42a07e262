#define PORT 1234
header h_t { bit<16> a; bit<8> b; }
struct headers { h_t h; }
control C(inout headers hdr) { table t { key = { hdr.h.a: exact; } actions = { NoAction; } } apply { t.apply(); } }
extern void foo();
@pragma query_field(h.a)
