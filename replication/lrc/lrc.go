package lrc

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/klauspost/reedsolomon"
)

// Errors returned by the codec. They are sentinels: test with errors.Is.
var (
	// ErrUndecodable: the surviving fragments do not determine the ones
	// asked for (information-theoretically: no choice of coefficients could
	// rebuild them). Shards are left as they were; no data is guessed.
	ErrUndecodable = errors.New("lrc: loss pattern is not decodable")
	// ErrShardCount: the shard slice does not have k+l+r entries.
	ErrShardCount = errors.New("lrc: wrong number of shards")
	// ErrShardSize: present shards differ in length.
	ErrShardSize = errors.New("lrc: shard sizes do not match")
	// ErrMissingShard: an operation that needs every data shard (Encode,
	// Join) or every shard (Verify) found one missing.
	ErrMissingShard = errors.New("lrc: shard missing")
	// ErrShortData: Split got no bytes, or Join was asked for more bytes
	// than the data shards hold.
	ErrShortData = errors.New("lrc: not enough data")
	// ErrInvalidOptions: Options.Validate failed.
	ErrInvalidOptions = errors.New("lrc: invalid options")
)

// Defaults: the LRC(12,2,2) sealed extents are coded with.
const (
	DefaultDataShards   = 12
	DefaultLocalGroups  = 2
	DefaultGlobalParity = 2
	DefaultPlanCache    = 1024
)

// Options configures a Code. The zero value is LRC(12,2,2).
type Options struct {
	// DataShards is k, the data fragments of a stripe. Default 12.
	DataShards int
	// LocalGroups is l: the data fragments are split into l groups of k/l
	// consecutive fragments, each with one XOR local parity. k must be
	// divisible by l. Default 2.
	LocalGroups int
	// GlobalParity is r, the parities computed over all data fragments.
	// Default 2.
	GlobalParity int
	// PlanCache bounds how many decode plans (one per pair of missing set
	// and wanted set) are kept. A plan costs about 12-18 µs to build and a
	// few KiB to keep. Default 1024; negative: keep none.
	PlanCache int
}

func (o Options) withDefaults() Options {
	if o.DataShards == 0 {
		o.DataShards = DefaultDataShards
	}
	if o.LocalGroups == 0 {
		o.LocalGroups = DefaultLocalGroups
	}
	if o.GlobalParity == 0 {
		o.GlobalParity = DefaultGlobalParity
	}
	if o.PlanCache == 0 {
		o.PlanCache = DefaultPlanCache
	}
	return o
}

// Validate reports what is wrong with o (after defaults are applied), as an
// error wrapping ErrInvalidOptions.
func (o Options) Validate() error {
	o = o.withDefaults()
	k, l, r := o.DataShards, o.LocalGroups, o.GlobalParity
	switch {
	case k < 1:
		return fmt.Errorf("%w: DataShards %d < 1", ErrInvalidOptions, k)
	case l < 1:
		return fmt.Errorf("%w: LocalGroups %d < 1", ErrInvalidOptions, l)
	case r < 1:
		return fmt.Errorf("%w: GlobalParity %d < 1", ErrInvalidOptions, r)
	case k%l != 0:
		return fmt.Errorf("%w: DataShards %d not divisible by LocalGroups %d", ErrInvalidOptions, k, l)
	case k+l+r > 256:
		return fmt.Errorf("%w: DataShards+LocalGroups+GlobalParity = %d > 256 (GF(2^8))", ErrInvalidOptions, k+l+r)
	}
	return nil
}

// Code is an LRC(k, l, r) erasure code. Shard i of a stripe is:
//
//	0 .. k-1         data fragments; group g holds g*k/l .. (g+1)*k/l-1
//	k .. k+l-1       local parity of group i-k (XOR of its data)
//	k+l .. k+l+r-1   global parity j = i-k-l: Σ c_d^(j+1) · data_d
//
// A Code is immutable apart from its plan cache and is safe for concurrent
// use.
type Code struct {
	k, l, r, n int
	groupSize  int
	gen        [][]byte            // n x k generator matrix; rows k.. are the parities
	enc        reedsolomon.Encoder // k data, l+r parity, custom matrix gen[k:]
	cacheMax   int                 // <= 0: no cache

	mu sync.Mutex
	// Guarded by mu.
	plans map[planKey]*plan
}

// New returns the code o describes, or an error wrapping ErrInvalidOptions.
func New(o Options) (*Code, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	c := &Code{
		k: o.DataShards, l: o.LocalGroups, r: o.GlobalParity,
		n:         o.DataShards + o.LocalGroups + o.GlobalParity,
		groupSize: o.DataShards / o.LocalGroups,
		cacheMax:  o.PlanCache,
		plans:     make(map[planKey]*plan),
	}
	c.gen = generator(c.k, c.l, c.r)
	enc, err := reedsolomon.New(c.k, c.l+c.r, reedsolomon.WithCustomMatrix(c.gen[c.k:]))
	if err != nil {
		return nil, fmt.Errorf("lrc: build encoder: %w", err)
	}
	c.enc = enc
	return c, nil
}

// coefficients returns c_d, the global-parity coefficient of each data
// fragment: global parity j multiplies data_d by c_d^(j+1).
//
// For two groups of at most 15 fragments (LRC(12,2,2), LRC(6,2,2)) this is
// the paper's construction (Huang et al. 2012, §2.2) lifted from GF(2^4) to
// GF(2^8): group 0 takes the α's from the nonzero elements whose low 4 bits
// are 0 (0x10, 0x20, ...), group 1 the β's from those whose high 4 bits are 0
// (0x01, 0x02, ...). A sum of distinct α's keeps its low bits 0 and is
// nonzero, a sum of β's keeps its high bits 0, so α_i, α_j, β_s, β_t ≠ 0,
// {α} ∩ {β} = ∅ and α_i+α_j ≠ β_s+β_t: the paper's conditions (9)-(11) for
// every 4-loss determinant, i.e. the Maximally Recoverable property for
// r = 2. TestMaximallyRecoverable checks it by enumeration.
//
// Otherwise the c_d are the distinct powers 2^d. Decoding stays exact (a
// pattern either solves or returns ErrUndecodable), but MR is not proven;
// TestMaximallyRecoverable enumerates the shapes it covers.
func coefficients(k, l int) []byte {
	c := make([]byte, k)
	gs := k / l
	if l == 2 && gs <= 15 {
		for j := range gs {
			c[j] = byte(j+1) << 4
			c[gs+j] = byte(j + 1)
		}
		return c
	}
	for d := range c {
		c[d] = gfExp[d]
	}
	return c
}

// generator returns the n x k generator matrix: identity, l local rows,
// r global rows.
func generator(k, l, r int) [][]byte {
	n := k + l + r
	gs := k / l
	coef := coefficients(k, l)
	g := make([][]byte, n)
	for i := range g {
		g[i] = make([]byte, k)
	}
	for d := range k {
		g[d][d] = 1
		g[k+d/gs][d] = 1
		for j := range r {
			g[k+l+j][d] = gfPow(coef[d], j+1)
		}
	}
	return g
}

// DataShards returns k.
func (c *Code) DataShards() int { return c.k }

// LocalGroups returns l.
func (c *Code) LocalGroups() int { return c.l }

// GlobalParity returns r.
func (c *Code) GlobalParity() int { return c.r }

// TotalShards returns k+l+r.
func (c *Code) TotalShards() int { return c.n }

// Group returns the local group of shard i (a data fragment or a local
// parity), or -1 for a global parity or an index out of range.
func (c *Code) Group(i int) int {
	switch {
	case i < 0 || i >= c.k+c.l:
		return -1
	case i < c.k:
		return i / c.groupSize
	default:
		return i - c.k
	}
}

// Matrix returns a copy of the (k+l+r) x k generator matrix over GF(2^8)
// (polynomial 0x11D): shard i = Σ_d Matrix()[i][d] · data_d.
func (c *Code) Matrix() [][]byte {
	m := make([][]byte, c.n)
	for i := range m {
		m[i] = slices.Clone(c.gen[i])
	}
	return m
}

// Encode computes the l+r parity shards of shards[k:] from the data shards
// shards[:k], which must all be present and of equal length. A parity shard
// with enough capacity is reused, otherwise allocated. Data shards are not
// modified.
func (c *Code) Encode(shards [][]byte) error {
	if len(shards) != c.n {
		return fmt.Errorf("%w: got %d, want %d", ErrShardCount, len(shards), c.n)
	}
	size := len(shards[0])
	for i, s := range shards[:c.k] {
		if len(s) == 0 {
			return fmt.Errorf("encode: data shard %d: %w", i, ErrMissingShard)
		}
		if len(s) != size {
			return fmt.Errorf("encode: data shard %d is %d bytes, shard 0 %d: %w", i, len(s), size, ErrShardSize)
		}
	}
	for i := c.k; i < c.n; i++ {
		shards[i] = sized(shards[i], size)
	}
	if err := c.enc.Encode(shards); err != nil {
		return fmt.Errorf("lrc: encode: %w", err)
	}
	return nil
}

// sized returns s resized to size bytes if its capacity allows, else a new
// slice. Contents are unspecified; callers overwrite them.
func sized(s []byte, size int) []byte {
	if cap(s) >= size {
		return s[:size]
	}
	return make([]byte, size)
}

// Verify reports whether every parity shard matches the data shards. All
// shards must be present and of equal length.
func (c *Code) Verify(shards [][]byte) (bool, error) {
	if len(shards) != c.n {
		return false, fmt.Errorf("%w: got %d, want %d", ErrShardCount, len(shards), c.n)
	}
	for i, s := range shards {
		if len(s) == 0 {
			return false, fmt.Errorf("verify: shard %d: %w", i, ErrMissingShard)
		}
		if len(s) != len(shards[0]) {
			return false, fmt.Errorf("verify: shard %d: %w", i, ErrShardSize)
		}
	}
	ok, err := c.enc.Verify(shards)
	if err != nil {
		return false, fmt.Errorf("lrc: verify: %w", err)
	}
	return ok, nil
}

// Reconstruct fills every missing shard (nil or zero length; one with
// enough capacity is reused). It reads only the shards the cheapest plan
// needs: a lone lost data fragment or local parity is rebuilt from its local
// group, k/l fragments. If the present shards do not determine the missing
// ones it returns ErrUndecodable and changes nothing.
//
// The present shards are trusted: a corrupt one yields corrupt output.
// Check block CRCs before decoding.
func (c *Code) Reconstruct(shards [][]byte) error {
	return c.reconstruct(shards, nil, true)
}

// ReconstructData fills the missing data shards only; missing parity shards
// stay missing.
func (c *Code) ReconstructData(shards [][]byte) error {
	return c.reconstruct(shards, nil, false)
}

// ReconstructSome fills the missing shards i with required[i] true.
// required has length k (data shards only) or k+l+r. Shards not required
// may be missing even if that makes the rest of the stripe undecodable: a
// reader that fetched only RepairPlan's fragments calls this with the lost
// fragments required.
func (c *Code) ReconstructSome(shards [][]byte, required []bool) error {
	if len(required) != c.k && len(required) != c.n {
		return fmt.Errorf("%w: required has %d entries, want %d or %d", ErrShardCount, len(required), c.k, c.n)
	}
	return c.reconstruct(shards, required, false)
}

func (c *Code) reconstruct(shards [][]byte, required []bool, parity bool) error {
	if len(shards) != c.n {
		return fmt.Errorf("%w: got %d, want %d", ErrShardCount, len(shards), c.n)
	}
	var missing, targets bitset
	size := -1
	for i, s := range shards {
		if len(s) == 0 {
			missing.set(i)
			switch {
			case required != nil:
				if i < len(required) && required[i] {
					targets.set(i)
				}
			case i < c.k || parity:
				targets.set(i)
			}
			continue
		}
		if size < 0 {
			size = len(s)
		} else if len(s) != size {
			return fmt.Errorf("reconstruct: shard %d is %d bytes, want %d: %w", i, len(s), size, ErrShardSize)
		}
	}
	if targets.empty() {
		return nil
	}
	if size < 0 {
		return fmt.Errorf("reconstruct: no shard present: %w", ErrUndecodable)
	}
	p, err := c.plan(missing, targets)
	if err != nil {
		return err
	}
	ni := len(p.inputs)
	bufs := make([][]byte, ni+len(p.outputs))
	for j, in := range p.inputs {
		bufs[j] = shards[in]
	}
	for j, out := range p.outputs {
		bufs[ni+j] = sized(shards[out], size)
	}
	if err := p.enc.Encode(bufs); err != nil {
		return fmt.Errorf("lrc: reconstruct: %w", err)
	}
	for j, out := range p.outputs {
		shards[out] = bufs[ni+j]
	}
	return nil
}

// RepairPlan returns the shards, ascending, a reader must fetch to rebuild
// the shards in lost, given which shards it could fetch (available[i];
// nil means every shard not in lost). A lost data fragment or local parity
// whose group is otherwise intact needs its k/l group members (6 for
// LRC(12,2,2)), not k. Having fetched them, the reader calls
// ReconstructSome with the lost shards required. Returns ErrUndecodable if
// the available shards do not determine the lost ones.
func (c *Code) RepairPlan(lost []int, available []bool) ([]int, error) {
	if available != nil && len(available) != c.n {
		return nil, fmt.Errorf("%w: available has %d entries, want %d", ErrShardCount, len(available), c.n)
	}
	var missing, targets bitset
	for i := range c.n {
		if available != nil && !available[i] {
			missing.set(i)
		}
	}
	for _, i := range lost {
		if i < 0 || i >= c.n {
			return nil, fmt.Errorf("lrc: repair plan: shard %d out of range [0,%d)", i, c.n)
		}
		missing.set(i)
		targets.set(i)
	}
	if targets.empty() {
		return nil, nil
	}
	p, err := c.plan(missing, targets)
	if err != nil {
		return nil, err
	}
	return slices.Clone(p.inputs), nil
}

// Decodable is the paper's check (Huang et al. 2012, §2.2) of whether a
// loss pattern is information-theoretically decodable: in each local group
// whose parity survives, that parity stands in for one lost data fragment;
// the pattern is decodable iff the data fragments still lost plus the
// global parities lost are at most r. Duplicates in lost are ignored; an
// index out of range makes it false.
//
// Because the coefficients make the code Maximally Recoverable (see
// coefficients), Reconstruct succeeds exactly on the patterns Decodable
// accepts; TestMaximallyRecoverable checks this for every pattern of up to
// l+r losses.
func (c *Code) Decodable(lost []int) bool {
	var seen bitset
	dataLost := make([]int, c.l)
	localLost := make([]bool, c.l)
	erased := 0
	for _, i := range lost {
		if i < 0 || i >= c.n {
			return false
		}
		if seen.has(i) {
			continue
		}
		seen.set(i)
		switch {
		case i < c.k:
			dataLost[i/c.groupSize]++
		case i < c.k+c.l:
			localLost[i-c.k] = true
		default:
			erased++ // a global parity
		}
	}
	for g := range c.l {
		if !localLost[g] && dataLost[g] > 0 {
			dataLost[g]-- // swap the surviving local parity for one lost fragment
		}
		erased += dataLost[g]
	}
	return erased <= c.r
}

// Split copies data into k equal data shards, the last padded with zeros,
// and allocates the l+r parity shards, all backed by one allocation. Call
// Encode next. Join with the original length undoes it.
func (c *Code) Split(data []byte) ([][]byte, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("split: %w", ErrShortData)
	}
	size := (len(data) + c.k - 1) / c.k
	buf := make([]byte, size*c.n)
	copy(buf, data)
	shards := make([][]byte, c.n)
	for i := range shards {
		shards[i] = buf[i*size : (i+1)*size : (i+1)*size]
	}
	return shards, nil
}

// Join writes the first outSize bytes of the data shards, in order, to dst.
// Every data shard must be present (call ReconstructData first).
func (c *Code) Join(dst io.Writer, shards [][]byte, outSize int) error {
	if len(shards) < c.k {
		return fmt.Errorf("%w: got %d, want at least %d", ErrShardCount, len(shards), c.k)
	}
	total := 0
	for i, s := range shards[:c.k] {
		if len(s) == 0 {
			return fmt.Errorf("join: data shard %d: %w", i, ErrMissingShard)
		}
		total += len(s)
	}
	if total < outSize {
		return fmt.Errorf("join: %d bytes wanted, data shards hold %d: %w", outSize, total, ErrShortData)
	}
	for _, s := range shards[:c.k] {
		if outSize <= 0 {
			break
		}
		s = s[:min(len(s), outSize)]
		if _, err := dst.Write(s); err != nil {
			return fmt.Errorf("lrc: join: %w", err)
		}
		outSize -= len(s)
	}
	return nil
}
