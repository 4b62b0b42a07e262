@pragma query_field(add_order.price, 32)
@pragma query_field(add_order.shares, 32)
@pragma query_field_exact(add_order.stock, 64)
@pragma query_default_action(drop)
