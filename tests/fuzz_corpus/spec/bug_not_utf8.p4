header h_t {
  bit<8> aÿ; }
@pragma query_field(h.a, 8)
