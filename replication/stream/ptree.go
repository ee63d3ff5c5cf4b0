package stream

import "iter"

// ptree is an ordered map with copy-on-write versions: the Manager's
// storage (see Manager.Clone). It is a treap (a binary search tree by key,
// a heap by a hash of the key) whose nodes carry the owner that made them.
// A writer with owner o modifies in place the nodes o owns and copies the
// others, with the path from the root to them: a version that shares
// nodes with others is never changed through them. Get, set and delete
// cost O(log n); iteration is in key order.
//
// The shape depends only on the keys (priorities are a function of the
// key, ties broken by key), never on the order of the writes; nothing
// observable depends on the shape anyway, only on the key order.
//
// A value is copied with the tree's clone function (a deep copy) the first
// time an owner takes it for writing (mut), not when its node is copied
// for a path: values hold slices that must not be shared with a writer.
type ptree[K, V any] struct {
	root *tnode[K, V]
	n    int
	kind *treeKind[K, V]
}

// treeKind is what a ptree needs to know of its keys and values.
type treeKind[K, V any] struct {
	cmp  func(a, b K) int
	hash func(K) uint64
	// clone deep-copies a value for writing; nil: copying V is enough.
	clone func(V) V
}

// owner marks the tree nodes a writer may modify in place. It has a size
// so that every new(owner) is a distinct pointer.
type owner struct{ _ byte }

type tnode[K, V any] struct {
	left, right *tnode[K, V]
	key         K
	val         V
	prio        uint64
	own         *owner // the writer that may modify this node in place
	valOwn      *owner // the writer that may modify val in place
}

func newTree[K, V any](kind *treeKind[K, V]) ptree[K, V] { return ptree[K, V]{kind: kind} }

// above reports whether a belongs above b in the heap.
func (t *ptree[K, V]) above(a, b *tnode[K, V]) bool {
	if a.prio != b.prio {
		return a.prio > b.prio
	}
	return t.kind.cmp(a.key, b.key) < 0
}

// w returns n itself if o owns it, else o's copy of it.
func (t *ptree[K, V]) w(o *owner, n *tnode[K, V]) *tnode[K, V] {
	if n.own == o {
		return n
	}
	c := *n
	c.own = o
	return &c
}

// Len is the number of keys.
func (t *ptree[K, V]) Len() int { return t.n }

// Get returns the value of k, read only (nil if there is none).
func (t *ptree[K, V]) Get(k K) *V {
	n := t.root
	for n != nil {
		switch c := t.kind.cmp(k, n.key); {
		case c < 0:
			n = n.left
		case c > 0:
			n = n.right
		default:
			return &n.val
		}
	}
	return nil
}

// Has reports whether k is in t.
func (t *ptree[K, V]) Has(k K) bool { return t.Get(k) != nil }

// Mut returns the value of k for writing by o (nil if there is none): o's
// own copy, made now if need be.
func (t *ptree[K, V]) Mut(o *owner, k K) *V {
	if !t.Has(k) {
		return nil
	}
	p := &t.root
	for {
		n := t.w(o, *p)
		*p = n
		switch c := t.kind.cmp(k, n.key); {
		case c < 0:
			p = &n.left
		case c > 0:
			p = &n.right
		default:
			if n.valOwn != o {
				if t.kind.clone != nil {
					n.val = t.kind.clone(n.val)
				}
				n.valOwn = o
			}
			return &n.val
		}
	}
}

// Set sets k to v (which the tree owns from now on) for writer o.
func (t *ptree[K, V]) Set(o *owner, k K, v V) {
	if p := t.Mut(o, k); p != nil {
		*p = v
		return
	}
	t.root = t.insert(o, t.root, &tnode[K, V]{key: k, val: v, prio: t.kind.hash(k), own: o, valOwn: o})
	t.n++
}

func (t *ptree[K, V]) insert(o *owner, n, nn *tnode[K, V]) *tnode[K, V] {
	if n == nil {
		return nn
	}
	if t.above(nn, n) {
		nn.left, nn.right = t.split(o, n, nn.key)
		return nn
	}
	n = t.w(o, n)
	if t.kind.cmp(nn.key, n.key) < 0 {
		n.left = t.insert(o, n.left, nn)
	} else {
		n.right = t.insert(o, n.right, nn)
	}
	return n
}

// split splits n into the keys below k and those above (k is not in n).
func (t *ptree[K, V]) split(o *owner, n *tnode[K, V], k K) (lo, hi *tnode[K, V]) {
	if n == nil {
		return nil, nil
	}
	n = t.w(o, n)
	if t.kind.cmp(n.key, k) < 0 {
		n.right, hi = t.split(o, n.right, k)
		return n, hi
	}
	lo, n.left = t.split(o, n.left, k)
	return lo, n
}

// Delete removes k for writer o and reports whether it was there.
func (t *ptree[K, V]) Delete(o *owner, k K) bool {
	if !t.Has(k) {
		return false
	}
	t.root = t.del(o, t.root, k)
	t.n--
	return true
}

func (t *ptree[K, V]) del(o *owner, n *tnode[K, V], k K) *tnode[K, V] {
	c := t.kind.cmp(k, n.key)
	if c == 0 {
		return t.merge(o, n.left, n.right)
	}
	n = t.w(o, n)
	if c < 0 {
		n.left = t.del(o, n.left, k)
	} else {
		n.right = t.del(o, n.right, k)
	}
	return n
}

// merge joins a and b, every key of a below every key of b.
func (t *ptree[K, V]) merge(o *owner, a, b *tnode[K, V]) *tnode[K, V] {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	case t.above(a, b):
		a = t.w(o, a)
		a.right = t.merge(o, a.right, b)
		return a
	default:
		b = t.w(o, b)
		b.left = t.merge(o, a, b.left)
		return b
	}
}

// All yields every key and its value (read only), in key order. The tree
// must not be written while it runs.
func (t *ptree[K, V]) All() iter.Seq2[K, *V] {
	return func(yield func(K, *V) bool) { t.walk(t.root, nil, yield) }
}

// From yields the keys from k up and their values, in key order.
func (t *ptree[K, V]) From(k K) iter.Seq2[K, *V] {
	return func(yield func(K, *V) bool) { t.walk(t.root, &k, yield) }
}

func (t *ptree[K, V]) walk(n *tnode[K, V], from *K, yield func(K, *V) bool) bool {
	for n != nil {
		if from == nil || t.kind.cmp(n.key, *from) >= 0 {
			if !t.walk(n.left, from, yield) || !yield(n.key, &n.val) {
				return false
			}
		}
		n = n.right
	}
	return true
}

// Keys returns the keys, in order.
func (t *ptree[K, V]) Keys() []K {
	out := make([]K, 0, t.n)
	for k := range t.All() {
		out = append(out, k)
	}
	return out
}

// Priorities are a fixed hash of the key, the same in every process: the
// shape is never observable, but a fixed hash keeps runs reproducible.

func hashU64(k uint64) uint64 {
	// splitmix64's finalizer.
	k += 0x9e3779b97f4a7c15
	k = (k ^ (k >> 30)) * 0xbf58476d1ce4e5b9
	k = (k ^ (k >> 27)) * 0x94d049bb133111eb
	return k ^ (k >> 31)
}

func hashString(s string) uint64 {
	// FNV-1a, then mixed.
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return hashU64(h)
}
