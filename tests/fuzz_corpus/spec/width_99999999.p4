header h_t { bit<99999999> a; }
struct headers { h_t h; }
@pragma query_field(h.a)
