package entity

import (
	"bytes"
	"fmt"
)

// Key is the engine key of an entity: an encoding of (PartitionKey,
// RowKey) whose bytewise order is the service's order, PartitionKey
// first, then RowKey, each compared by its UTF-8 bytes (as edm.Compare
// orders strings):
//
//	| PartitionKey, each 0x00 written 0x00 0xFF | 0x00 0x01 | RowKey as is |
//
// The terminator 0x00 0x01 sorts below every escaped or plain byte that
// can follow in a longer PartitionKey, so a PartitionKey sorts before
// its extensions, and the RowKey, last, needs no escaping. Never change
// this layout: stored keys and partition boundaries use it.
func Key(pk, rk string) []byte {
	k := PartitionPrefix(pk)
	return append(k, rk...)
}

// PartitionPrefix is the prefix every Key of the PartitionKey pk has,
// and the smallest such key (Key(pk, "")).
func PartitionPrefix(pk string) []byte {
	k := make([]byte, 0, len(pk)+2+16)
	for i := 0; i < len(pk); i++ {
		k = append(k, pk[i])
		if pk[i] == 0 {
			k = append(k, 0xFF)
		}
	}
	return append(k, 0x00, 0x01)
}

// PartitionEnd is the smallest key above every Key of pk: the entities
// of one partition are the keys in [PartitionPrefix(pk), PartitionEnd(pk)).
func PartitionEnd(pk string) []byte {
	k := PartitionPrefix(pk)
	k[len(k)-1] = 0x02
	return k
}

// SplitKey inverts Key. A key Key did not make is an error wrapping
// ErrCorrupt.
func SplitKey(k []byte) (pk, rk string, err error) {
	var b []byte
	for i := 0; ; {
		j := bytes.IndexByte(k[i:], 0)
		if j < 0 || i+j+1 >= len(k) {
			return "", "", fmt.Errorf("entity: split key %q: no PartitionKey terminator: %w", k, ErrCorrupt)
		}
		j += i
		b = append(b, k[i:j]...)
		switch k[j+1] {
		case 0xFF:
			b = append(b, 0)
			i = j + 2
		case 0x01:
			return string(b), string(k[j+2:]), nil
		default:
			return "", "", fmt.Errorf("entity: split key %q: byte %#x after 0x00: %w", k, k[j+1], ErrCorrupt)
		}
	}
}
