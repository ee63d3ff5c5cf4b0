package tablemaster

import (
	"fmt"
	"slices"
	"testing"
)

func cand(id, fd string, replicas int) Candidate {
	return Candidate{ID: id, FaultDomain: fd, Replicas: replicas, Available: true}
}

func TestPlace(t *testing.T) {
	down := cand("s2", "b", 0)
	down.Available = false
	tests := []struct {
		name  string
		cands []Candidate
		hosts []string
		n     int
		want  []string
	}{
		{"fewest replicas first", []Candidate{cand("s1", "a", 3), cand("s2", "b", 1), cand("s3", "c", 2)}, nil, 1, []string{"s2"}},
		{"tie broken by id", []Candidate{cand("s3", "c", 1), cand("s1", "a", 1), cand("s2", "b", 1)}, nil, 2, []string{"s1", "s2"}},
		{"unavailable skipped", []Candidate{cand("s1", "a", 5), down}, nil, 1, []string{"s1"}},
		{"host skipped", []Candidate{cand("s1", "a", 0), cand("s2", "b", 9)}, []string{"s1"}, 1, []string{"s2"}},
		{"host's domain skipped", []Candidate{cand("s1", "a", 0), cand("s2", "a", 0), cand("s3", "b", 5)}, []string{"s1"}, 1, []string{"s3"}},
		{"one per domain", []Candidate{cand("s1", "a", 0), cand("s2", "a", 0), cand("s3", "b", 1)}, nil, 3, []string{"s1", "s3"}},
		{"empty domain is its own", []Candidate{cand("s1", "", 0), cand("s2", "", 0)}, nil, 2, []string{"s1", "s2"}},
		{"unknown host is its own domain", []Candidate{cand("s1", "", 0)}, []string{"gone"}, 1, []string{"s1"}},
		{"no candidates", nil, nil, 1, nil},
		{"n zero", []Candidate{cand("s1", "a", 0)}, nil, 0, nil},
		{"n negative", []Candidate{cand("s1", "a", 0)}, nil, -1, nil},
		{"fewer than asked", []Candidate{cand("s1", "a", 0)}, nil, 3, []string{"s1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.cands)
			got := Place(tc.cands, tc.hosts, tc.n)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Place = %v, want %v", got, tc.want)
			}
			if !slices.Equal(in, tc.cands) {
				t.Fatalf("Place modified its candidates")
			}
		})
	}
}

// placeMany places parts partitions of rf replicas the way State.fill does
// and returns the replica sets and the final candidates.
func placeMany(cands []Candidate, parts, rf int) ([][]string, []Candidate) {
	cands = slices.Clone(cands)
	var sets [][]string
	for range parts {
		picks := Place(cands, nil, rf)
		for _, id := range picks {
			for k := range cands {
				if cands[k].ID == id {
					cands[k].Replicas++
				}
			}
		}
		sets = append(sets, picks)
	}
	return sets, cands
}

func TestPlaceSpread(t *testing.T) {
	tests := []struct {
		name      string
		servers   int
		domains   int
		parts, rf int
		wantEach  int
	}{
		{"12 on 3", 3, 3, 12, 1, 4},
		{"12 on 4", 4, 4, 12, 1, 3},
		{"rf3 over 3 domains of 2", 6, 3, 6, 3, 3},
		{"rf3 over 3 domains of 3", 9, 3, 12, 3, 4},
		{"rf3 over 5 domains", 5, 5, 10, 3, 6},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var cands []Candidate
			domainOf := map[string]string{}
			for i := range tc.servers {
				id := fmt.Sprintf("s%02d", i)
				fd := fmt.Sprintf("fd%d", i%tc.domains)
				domainOf[id] = fd
				cands = append(cands, cand(id, fd, 0))
			}
			sets, final := placeMany(cands, tc.parts, tc.rf)
			for i, set := range sets {
				if len(set) != tc.rf {
					t.Fatalf("partition %d got %d replicas %v, want %d", i, len(set), set, tc.rf)
				}
				seen := map[string]bool{}
				for _, id := range set {
					if seen[domainOf[id]] {
						t.Fatalf("partition %d has two replicas in fault domain %s: %v", i, domainOf[id], set)
					}
					seen[domainOf[id]] = true
				}
			}
			for _, c := range final {
				if c.Replicas != tc.wantEach {
					t.Fatalf("server %s holds %d replicas, want %d (all: %v)", c.ID, c.Replicas, tc.wantEach, final)
				}
			}
		})
	}
}
