package abi

// ReservedPrefix starts every key the platform keeps for itself in a
// table's key space (idempotency records today). A guest can neither read
// nor write such a key, and scans skip them. Never change it.
const ReservedPrefix = "\x00tabula/"

// IdempotencyPrefix starts an idempotency record's key: the prefix followed
// by the call's token.
const IdempotencyPrefix = ReservedPrefix + "idem/"
