package lrc_test

import (
	"bytes"
	"fmt"

	"github.com/tabuladb/tabula/replication/lrc"
)

func Example() {
	code, err := lrc.New(lrc.Options{}) // LRC(12,2,2)
	if err != nil {
		panic(err)
	}
	data := bytes.Repeat([]byte("sealed extent "), 1000)
	shards, _ := code.Split(data)
	_ = code.Encode(shards) // shards[12:14] local parities, [14:16] global

	// Fragment 3 is lost: fetch only what its local group needs.
	read, _ := code.RepairPlan([]int{3}, nil)
	fmt.Println("read", read)
	fetched := make([][]byte, code.TotalShards())
	for _, i := range read {
		fetched[i] = shards[i]
	}
	required := make([]bool, code.TotalShards())
	required[3] = true
	if err := code.ReconstructSome(fetched, required); err != nil {
		panic(err)
	}
	fmt.Println("rebuilt", bytes.Equal(fetched[3], shards[3]))

	// Four losses: decodable or not, never wrong data.
	fmt.Println(code.Decodable([]int{0, 1, 6, 7}), code.Decodable([]int{0, 1, 2, 12}))
	// Output:
	// read [0 1 2 4 5 12]
	// rebuilt true
	// true false
}
