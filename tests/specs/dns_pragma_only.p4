/*
 * Form: a pragma-only spec, as Camus's DNS responder example wrote it: no headers, no parser,
 * only @pragma lines, every query field with its width, and a default action that the spec
 * does not declare.  The rules (dns.sub) call an action the spec does not declare either
 * (answerDNS with an IPv4 address): a front end infers it from the rules.  With no parser,
 * only the subscription control block and its entries can be generated.
 *
 * Camus wrote the query name as one wide field (256 bits); subc limits fields to 128 bits, so
 * the name here is 128 bits (16 ASCII characters, left-aligned and space padded).
 * Written for subc's test corpus in the style of Camus; not a copy of any Camus file.
 */

@pragma query_field_exact(dns_query.qname, 128)
@pragma query_field_exact(dns_query.qtype, 16)
@pragma query_field(ipv4.srcAddr, 32)
@pragma query_field_lpm(ipv4.dstAddr, 32)
@pragma query_default_action(notfoundDNS)
