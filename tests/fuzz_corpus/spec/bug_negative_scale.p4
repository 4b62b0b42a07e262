@pragma query_field(h.a, 8)
@pragma query_field_scale(h.a, -3)
