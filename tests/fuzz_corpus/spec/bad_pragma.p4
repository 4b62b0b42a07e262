@pragma query_field(h.a, 8)
@pragma query_frobnicate(h.a)
@pragma
