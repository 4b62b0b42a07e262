header h_t { bit<0> a; }
struct headers { h_t h; }
@pragma query_field(h.a)
