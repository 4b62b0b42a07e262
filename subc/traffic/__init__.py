"""Traffic tools: replaying a trace as MoldUDP64 datagrams, listening as a subscriber, the topic client."""
