// Package auth authenticates Tabula's RPCs: request signing with a
// principal's key, the server-side check (signature, clock window, replay,
// access by method and tenant), and the credential file format.
//
// A principal is a tenant (its name) or the cluster (ClusterPrincipal): the
// operator and the cluster's own processes, which may act for any tenant.
// A tenant has two 512-bit keys, either of which signs, so one can be
// rotated while the other serves; the cluster has one.
//
// Every RPC carries, in one gRPC metadata entry (MDAuth), the principal,
// the number of the key that signed (1 or 2; 0 for the cluster key), a
// timestamp, a random nonce and an HMAC-SHA256 over
//
//	"TABULA-HMAC-SHA256" \n method \n principal \n key number \n
//	timestamp (unix ms) \n nonce \n hex(SHA-256(request))
//
// where request is the request message's bytes as sent: the SDK sends its
// deterministic protobuf encoding, and a server hashes what it received
// (VerifierOptions.Digests), encoding the message again only when those
// bytes are not at hand. Streaming RPCs sign empty bytes; their messages
// are checked for tenant as they arrive. A server refuses (UNAUTHENTICATED) a missing, malformed or wrong
// signature, a timestamp more than MaxClockSkew from its clock, and a
// signature it has seen before (the replay cache remembers each accepted
// signature until its timestamp leaves the window; past its capacity it
// forgets the oldest and refuses timestamps older than what it still
// remembers). It refuses (PERMISSION_DENIED) a tenant calling a method that
// needs the cluster credential, and a request naming another tenant; a
// tenant's request with an empty tenant field is read as its own tenant.
//
// Concurrency: Credential, Verifier and the keyrings are safe for
// concurrent use.
package auth
