// Package sharedkey authenticates requests to the Azure Table gateway as
// the service does, and signs requests and SAS tokens for our own
// clients and tests.
//
// Verify accepts four kinds of credentials:
//
//   - Shared Key (Table form): Authorization: SharedKey account:sig, over
//     VERB\nContent-MD5\nContent-Type\nDate\nCanonicalizedResource.
//   - Shared Key Lite (Table form, what aztables sends):
//     Authorization: SharedKeyLite account:sig, over
//     Date\nCanonicalizedResource.
//   - A service SAS for one table (sv, tn, sp from "raud", st, se,
//     spk/srk/epk/erk, sip, spr, si, sig), signed over
//     sp\nst\nse\n/table/account/tn\nsi\nsip\nspr\nsv\nspk\nsrk\nepk\nerk.
//   - An account SAS (ss containing t, srt from "sco", sp from
//     "racwdlup"), signed over
//     account\nsp\nss\nsrt\nst\nse\nsip\nspr\nsv\n (and ses\n from sv
//     2020-12-06 on).
//
// Date is the x-ms-date header if present, else Date; it must be within
// MaxClockSkew of the server's clock. CanonicalizedResource is "/" +
// account + the request's path as it was sent (escaped), + "?comp=" +
// value when a comp parameter is present. With path-style addressing
// the path carries the account too: "/devstoreaccount1/devstoreaccount1/
// Tables". A request to "account-secondary" may be signed over the path
// with or without the suffix. Signatures are compared in constant time
// against each of the account's keys (up to two, for rotation).
//
// Verify answers who is asking (a Principal); Principal.Allows then
// answers whether that principal may do one operation, with the
// service's error codes. The gateway calls Allows once per operation,
// for each operation of a batch too, and clips a SAS holder's range
// queries to Principal.Keys.
//
// Errors are *Error values carrying the service's code, status and
// message; the service sends them as XML (Error.XML).
//
// Example:
//
//	p, err := sharedkey.Verify(r, account, tenants, time.Now())
//	if err != nil { /* write err.(*sharedkey.Error).XML() with its Status */ }
//	if err := p.Allows(sharedkey.OpInsertEntity, table, pk, rk); err != nil { ... }
//
// Everything here is a pure function of its arguments (the clock is a
// parameter) and safe for concurrent use; Keys implementations must be
// safe for concurrent use themselves.
package sharedkey
