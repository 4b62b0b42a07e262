header h_t { bit<8> a; bit<8> b; }
struct headers { h_t h; h_t[4] stack; }
action answer(bit<32> ip) { hdr.h.a = 1; }
@pragma query_field_exact(h.b)
@pragma query_default_action(answer)
parser P(packet_in p, out headers hdr) { state start { p.extract(hdr.h); transition select(hdr.h.a, hdr.h.b) { (1, _): accept; default: reject; } } }
