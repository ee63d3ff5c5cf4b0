package tableserver

import (
	"slices"
	"testing"

	"github.com/tabuladb/tabula/api"
)

func TestBulkFetchPlan(t *testing.T) {
	file := func(stream string) []*api.BulkFile {
		return []*api.BulkFile{{Stream: "x"}, {Stream: stream}}
	}
	v := func(version, base uint64, stream string) *api.BulkVersion {
		return &api.BulkVersion{Version: version, BaseVersion: base, Streams: true, Files: file(stream)}
	}
	for _, c := range []struct {
		name    string
		info    *api.BulkInfo
		missing []uint64
		want    []uint64
		wait    bool
	}{
		{"serving chain first, base before delta", &api.BulkInfo{Current: 4, Versions: []*api.BulkVersion{v(1, 0, "s1"), v(2, 1, "s2"), v(3, 0, "s3"), v(4, 2, "s4")}},
			[]uint64{3, 4, 1, 2}, []uint64{1, 2, 4, 3}, false},
		{"full serving first, then the others ascending", &api.BulkInfo{Current: 3, Versions: []*api.BulkVersion{v(1, 0, "s1"), v(2, 1, "s2"), v(3, 0, "s3")}},
			[]uint64{1, 2, 3}, []uint64{3, 1, 2}, false},
		{"not stored yet: wait", &api.BulkInfo{Current: 1, Versions: []*api.BulkVersion{v(1, 0, "s1"), v(2, 0, "")}},
			[]uint64{1, 2}, []uint64{1}, true},
		{"dropped meanwhile: skipped", &api.BulkInfo{Current: 1, Versions: []*api.BulkVersion{v(1, 0, "s1")}},
			[]uint64{5}, nil, false},
	} {
		jobs, wait := bulkFetchPlan(c.info, 1, c.missing)
		var got []uint64
		for _, j := range jobs {
			got = append(got, j.version)
			if j.file.GetStream() == "" {
				t.Fatalf("%s: a job without a stream", c.name)
			}
		}
		if !slices.Equal(got, c.want) || wait != c.wait {
			t.Fatalf("%s: plan %v wait %v, want %v wait %v", c.name, got, wait, c.want, c.wait)
		}
	}
}
