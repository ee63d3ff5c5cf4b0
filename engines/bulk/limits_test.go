package bulk

import (
	"testing"

	"github.com/tabuladb/tabula/api"
)

func TestLimitsMatchAPI(t *testing.T) {
	if maxKeyBytes != api.MaxKeyBytes || defaultMaxValueBytes != api.DefaultMaxValueBytes ||
		maxValueBytesLimit != api.MaxValueBytesLimit || defaultPartitions != api.DefaultPartitions ||
		maxPartitions != api.MaxPartitions {
		t.Fatal("engines/bulk's copies of the api limits differ from api's")
	}
}
