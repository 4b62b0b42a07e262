"""Wire formats, read and written without the compiler: MoldUDP64, BinaryFILE, captures (pcap/pcapng),
the spec-driven message decoder and encoder.
"""
