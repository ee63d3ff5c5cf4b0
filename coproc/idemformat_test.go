package coproc

import (
	"encoding/binary"
	"hash/crc32"
	"testing"
)

// TestIdemRecordVersion1Readable: records written before input digests
// (version 1) still decode, without a digest, so a retry within their TTL
// is still replayed.
func TestIdemRecordVersion1Readable(t *testing.T) {
	b := []byte{1, 0, 0, 0, 0}
	b = binary.LittleEndian.AppendUint16(b, 1)
	b = append(b, 'm')
	b = binary.LittleEndian.AppendUint16(b, 3)
	b = append(b, "add"...)
	b = binary.LittleEndian.AppendUint32(b, 3)
	b = append(b, "out"...)
	binary.LittleEndian.PutUint32(b[1:], crc32.Checksum(b[5:], castagnoli))
	r, err := decodeIdemRecord(b)
	if err != nil || r.module != "m" || r.method != "add" || string(r.output) != "out" || r.hasDigest {
		t.Fatalf("version 1 record: %+v %v", r, err)
	}
	d := inputDigest([]byte("x"), [][]byte{[]byte("k")}, KeyRange{})
	r2, err := decodeIdemRecord(encodeIdemRecord(idemRecord{module: "m", method: "add", digest: d, hasDigest: true, output: []byte("o")}))
	if err != nil || !r2.hasDigest || r2.digest != d {
		t.Fatalf("version 2 round trip: %+v %v", r2, err)
	}
	// Framing: moving a byte between input and key changes the digest.
	if inputDigest([]byte("xk"), nil, KeyRange{}) == inputDigest([]byte("x"), [][]byte{[]byte("k")}, KeyRange{}) ||
		inputDigest(nil, nil, KeyRange{Start: []byte{}}) == inputDigest(nil, nil, KeyRange{}) {
		t.Fatal("digest collides across fields")
	}
}
