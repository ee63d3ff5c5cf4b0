package main

import "testing"

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]uint64{"0": 0, "1048576": 1 << 20, "1MiB": 1 << 20, "1.5 GiB": 3 << 29, "10GB": 10e9, "512B": 512, "2KiB": 2048} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "lots", "-1", "1XB", "1e30", "NaN", "MiB"} {
		if got, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q) = %d, want an error", in, got)
		}
	}
}

func FuzzParseBytes(f *testing.F) {
	for _, s := range []string{"1MiB", "10GB", "0", "-1", "1e30", "NaN", "Inf"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseBytes(s)
		if err != nil && n != 0 {
			t.Fatalf("parseBytes(%q) = %d with error %v", s, n, err)
		}
	})
}
