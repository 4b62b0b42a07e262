@pragma query_field(h.a, 200)
