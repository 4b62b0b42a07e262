header h_t { bit<8> a; }
struct headers { h_t h; }
parser P(packet_in p, out headers hdr) { state start { transition select(