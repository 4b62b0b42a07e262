typedef bit<32> ip_t;
const bit<8> W = 8;
header h_t { ip_t addr; bit<W> k; varbit<320> opts; h_t2 x; }
