package schedindex

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/vault/sdk/logical"
)

// faulty wraps storage so that chosen calls fail: fail["put sched/3"] = n
// fails the next n Puts of that key, fail["put"] = n the next n Puts of any
// key (likewise get, delete, list). It counts the writes that reached
// storage, per key.
type faulty struct {
	logical.Storage
	mu     sync.Mutex
	fail   map[string]int
	writes map[string]int
}

func newFaulty() *faulty {
	return &faulty{Storage: new(logical.InmemStorage), fail: map[string]int{}, writes: map[string]int{}}
}

var errInjected = errors.New("injected storage failure")

func (f *faulty) failNext(rule string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[rule] += n
}

func (f *faulty) check(op, key string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, rule := range []string{op + " " + key, op} {
		if f.fail[rule] > 0 {
			f.fail[rule]--
			return fmt.Errorf("%s %s: %w", op, key, errInjected)
		}
	}
	if op == "put" || op == "delete" {
		f.writes[key]++
	}
	return nil
}

func (f *faulty) written(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.writes[key]
}

func (f *faulty) Get(ctx context.Context, key string) (*logical.StorageEntry, error) {
	if err := f.check("get", key); err != nil {
		return nil, err
	}
	return f.Storage.Get(ctx, key)
}

func (f *faulty) Put(ctx context.Context, e *logical.StorageEntry) error {
	if err := f.check("put", e.Key); err != nil {
		return err
	}
	return f.Storage.Put(ctx, e)
}

func (f *faulty) Delete(ctx context.Context, key string) error {
	if err := f.check("delete", key); err != nil {
		return err
	}
	return f.Storage.Delete(ctx, key)
}

func (f *faulty) List(ctx context.Context, prefix string) ([]string, error) {
	if err := f.check("list", prefix); err != nil {
		return nil, err
	}
	return f.Storage.List(ctx, prefix)
}

var (
	ctx = context.Background()
	t0  = time.Unix(1_800_000_000, 0)
)

func item(sec int) Item { return NewItem(t0.Add(time.Duration(sec)*time.Second), t0.Add(time.Hour)) }

// stored reads shard i as storage holds it; nil when absent.
func stored(t *testing.T, s logical.Storage, i int) map[string]Item {
	t.Helper()
	e, err := s.Get(ctx, shardPath(i))
	if err != nil {
		t.Fatal(err)
	}
	if e == nil {
		return nil
	}
	items := map[string]Item{}
	if err := json.Unmarshal(e.Value, &items); err != nil {
		t.Fatal(err)
	}
	return items
}

// storedAll is every entry in storage, by key, with the shard that holds it.
func storedAll(t *testing.T, s logical.Storage) (map[string]Item, map[string][]int) {
	t.Helper()
	keys, err := s.List(ctx, Prefix)
	if err != nil {
		t.Fatal(err)
	}
	out, where := map[string]Item{}, map[string][]int{}
	for _, k := range keys {
		i, err := strconv.Atoi(k)
		if err != nil {
			t.Fatalf("unexpected key %s%s", Prefix, k)
		}
		for key, it := range stored(t, s, i) {
			out[key] = it
			where[key] = append(where[key], i)
		}
	}
	return out, where
}

func putShard(t *testing.T, s logical.Storage, i int, items map[string]Item) {
	t.Helper()
	b, err := json.Marshal(items)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, &logical.StorageEntry{Key: shardPath(i), Value: b}); err != nil {
		t.Fatal(err)
	}
}

// keysIn returns n distinct keys of the form prefix+number that fall in
// shard i.
func keysIn(i, n int, prefix string) []string {
	var out []string
	for j := 0; len(out) < n; j++ {
		if k := prefix + strconv.Itoa(j); shardOf(k) == i {
			out = append(out, k)
		}
	}
	return out
}

// otherShard returns a key whose shard differs from key's.
func otherShard(key string) string {
	for j := 0; ; j++ {
		if k := "other" + strconv.Itoa(j); shardOf(k) != shardOf(key) {
			return k
		}
	}
}

func loaded(t *testing.T, s logical.Storage) *Index {
	t.Helper()
	x := New()
	if err := x.Load(ctx, s, nil); err != nil {
		t.Fatal(err)
	}
	return x
}

func TestItem(t *testing.T) {
	next, exp := t0.Add(time.Minute), t0.Add(time.Hour)
	it := NewItem(next, exp)
	if it != (Item{next.UnixNano(), exp.UnixNano()}) {
		t.Fatalf("NewItem = %v", it)
	}
	if !it.Next().Equal(next) || !it.Exp().Equal(exp) {
		t.Errorf("Next, Exp = %v, %v; want %v, %v", it.Next(), it.Exp(), next, exp)
	}
	zero := NewItem(time.Time{}, time.Time{})
	if zero != (Item{}) {
		t.Errorf("NewItem of zero times = %v, want 0, 0", zero)
	}
	if !zero.Next().IsZero() || !zero.Exp().IsZero() {
		t.Errorf("zero item's times = %v, %v, want zero times", zero.Next(), zero.Exp())
	}
	b, err := json.Marshal(map[string]Item{"r": {1, 2}})
	if err != nil || string(b) != `{"r":[1,2]}` {
		t.Errorf("encoding = %s, %v; want the on-disk form {\"r\":[1,2]}", b, err)
	}
}

// Set writes the key's shard, and only when the entry changes; Drop removes
// the entry, and deletes the shard it empties.
func TestSetAndDropWriteTheirShard(t *testing.T) {
	s := newFaulty()
	x := loaded(t, s)
	a := "role-a"
	b := keysIn(shardOf(a), 1, "role-b-")[0]
	c := otherShard(a)
	i := shardOf(a)
	path := shardPath(i)

	x.Set(ctx, s, a, item(1).Next(), item(1).Exp())
	if got := stored(t, s, i); !maps.Equal(got, map[string]Item{a: item(1)}) {
		t.Fatalf("shard after Set = %v", got)
	}
	x.Set(ctx, s, a, item(1).Next(), item(1).Exp())
	if n := s.written(path); n != 1 {
		t.Errorf("%d writes after setting the same entry twice, want 1", n)
	}
	x.Set(ctx, s, b, item(2).Next(), item(2).Exp())
	x.Set(ctx, s, a, item(3).Next(), item(3).Exp())
	if got := stored(t, s, i); !maps.Equal(got, map[string]Item{a: item(3), b: item(2)}) {
		t.Fatalf("shard after three Sets = %v", got)
	}
	x.Set(ctx, s, c, time.Time{}, time.Time{})
	if got := stored(t, s, shardOf(c)); !maps.Equal(got, map[string]Item{c: {}}) {
		t.Errorf("other shard = %v", got)
	}

	writes := s.written(path)
	x.Drop(ctx, s, "absent")
	x.Drop(ctx, s, keysIn(i, 1, "absent-")[0])
	if n := s.written(path); n != writes {
		t.Errorf("dropping absent keys wrote the shard %d times", n-writes)
	}
	x.Drop(ctx, s, a)
	if got := stored(t, s, i); !maps.Equal(got, map[string]Item{b: item(2)}) {
		t.Fatalf("shard after Drop = %v", got)
	}
	x.Drop(ctx, s, b)
	if e, _ := s.Storage.Get(ctx, path); e != nil {
		t.Errorf("emptied shard still stored: %s", e.Value)
	}
	if got, want := x.Entries(), map[string]Item{c: {}}; !maps.Equal(got, want) {
		t.Errorf("Entries = %v, want %v", got, want)
	}
}

// A failed write leaves the shard dirty: this node's copy keeps the change,
// and the next write of the shard, even one that changes nothing, stores it.
func TestFailedWriteLeavesTheShardDirty(t *testing.T) {
	for _, tc := range []struct {
		name  string
		retry func(x *Index, s logical.Storage, key string)
	}{
		{"the same Set again", func(x *Index, s logical.Storage, key string) { x.Set(ctx, s, key, item(1).Next(), item(1).Exp()) }},
		{"a Drop of an absent key", func(x *Index, s logical.Storage, key string) { x.Drop(ctx, s, keysIn(shardOf(key), 1, "absent-")[0]) }},
		{"a Repair", func(x *Index, s logical.Storage, key string) {
			if err := x.Repair(ctx, s, x.Mark(), map[string]Item{key: item(1)}, func(string) bool { return false }); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newFaulty()
			x := loaded(t, s)
			key := "role"
			s.failNext("put "+shardPath(shardOf(key)), 1)
			x.Set(ctx, s, key, item(1).Next(), item(1).Exp())
			if got := stored(t, s, shardOf(key)); got != nil {
				t.Fatalf("failed write stored %v", got)
			}
			if got := x.Entries(); !maps.Equal(got, map[string]Item{key: item(1)}) {
				t.Fatalf("Entries after the failed write = %v, want the change kept", got)
			}
			tc.retry(x, s, key)
			if got := stored(t, s, shardOf(key)); !maps.Equal(got, map[string]Item{key: item(1)}) {
				t.Fatalf("after %s storage has %v", tc.name, got)
			}
			// Clean again: the same Set writes nothing.
			n := s.written(shardPath(shardOf(key)))
			x.Set(ctx, s, key, item(1).Next(), item(1).Exp())
			if m := s.written(shardPath(shardOf(key))); m != n {
				t.Errorf("a clean shard was written again")
			}
		})
	}
}

// A failed delete (the Drop that empties a shard) leaves it dirty too.
func TestFailedDeleteLeavesTheShardDirty(t *testing.T) {
	s := newFaulty()
	x := loaded(t, s)
	x.Set(ctx, s, "role", item(1).Next(), item(1).Exp())
	s.failNext("delete", 1)
	x.Drop(ctx, s, "role")
	if got := stored(t, s, shardOf("role")); got == nil {
		t.Fatal("failed delete applied")
	}
	x.Drop(ctx, s, "role")
	if got := stored(t, s, shardOf("role")); got != nil {
		t.Errorf("after a second Drop storage still has %v", got)
	}
}

// A shard this node never loaded is never written by Set or Drop: a node
// that failed to read it would overwrite what storage has with its partial
// copy. Repair writes it whole, from the pass's view.
func TestShardNeverLoadedIsNeverWritten(t *testing.T) {
	key := "role"
	i := shardOf(key)
	theirs := keysIn(i, 3, "theirs-")
	before := map[string]Item{theirs[0]: item(10), theirs[1]: item(11), theirs[2]: item(12)}
	setup := func(t *testing.T) *faulty {
		s := newFaulty()
		putShard(t, s.Storage, i, before)
		return s
	}
	check := func(t *testing.T, x *Index, s *faulty) {
		t.Helper()
		x.Set(ctx, s, key, item(1).Next(), item(1).Exp())
		x.Drop(ctx, s, theirs[0])
		if n := s.written(shardPath(i)); n != 0 {
			t.Fatalf("an unloaded shard was written %d times", n)
		}
		if got := stored(t, s, i); !maps.Equal(got, before) {
			t.Fatalf("storage changed to %v", got)
		}
		if got := x.Entries()[key]; got != item(1) {
			t.Errorf("this node's copy of the unloaded shard has %v for the key set, want %v", got, item(1))
		}
		// Another, loaded, shard is written as usual.
		if x.shards[shardOf(otherShard(key))].loaded {
			o := otherShard(key)
			x.Set(ctx, s, o, item(2).Next(), item(2).Exp())
			if got := stored(t, s, shardOf(o)); !maps.Equal(got, map[string]Item{o: item(2)}) {
				t.Errorf("loaded shard = %v", got)
			}
		}
		// The pass knows every key: Repair writes the shard whole, with the
		// changes made since its mark.
		since := x.Mark()
		x.Set(ctx, s, theirs[2], item(13).Next(), item(13).Exp())
		want := map[string]Item{theirs[1]: item(21), theirs[2]: item(22), key: item(1)}
		if err := x.Repair(ctx, s, since, want, func(string) bool { return false }); err != nil {
			t.Fatal(err)
		}
		exp := map[string]Item{theirs[1]: item(21), theirs[2]: item(13), key: item(1)}
		if got := stored(t, s, i); !maps.Equal(got, exp) {
			t.Fatalf("after Repair storage has %v, want %v", got, exp)
		}
		// Now it is loaded: Set writes it.
		x.Set(ctx, s, theirs[1], item(31).Next(), item(31).Exp())
		if got := stored(t, s, i)[theirs[1]]; got != item(31) {
			t.Errorf("Set after Repair stored %v", got)
		}
	}
	t.Run("no Load", func(t *testing.T) {
		s := setup(t)
		check(t, New(), s)
	})
	t.Run("its read failed", func(t *testing.T) {
		s := setup(t)
		s.failNext("get "+shardPath(i), 1)
		x := New()
		err := x.Load(ctx, s, nil)
		if !errors.Is(err, errInjected) {
			t.Fatalf("Load = %v, want the read error", err)
		}
		check(t, x, s)
	})
	t.Run("its shard is not JSON", func(t *testing.T) {
		s := setup(t)
		if err := s.Put(ctx, &logical.StorageEntry{Key: shardPath(i), Value: []byte("{")}); err != nil {
			t.Fatal(err)
		}
		x := New()
		if err := x.Load(ctx, s, nil); err == nil {
			t.Fatal("Load of a broken shard succeeded")
		}
		s.writes = map[string]int{}
		x.Set(ctx, s, key, item(1).Next(), item(1).Exp())
		if n := s.written(shardPath(i)); n != 0 {
			t.Fatalf("an undecodable shard was written %d times", n)
		}
	})
	t.Run("the list failed", func(t *testing.T) {
		s := setup(t)
		s.failNext("list", 1)
		x := New()
		if err := x.Load(ctx, s, nil); !errors.Is(err, errInjected) {
			t.Fatalf("Load = %v, want the list error", err)
		}
		check(t, x, s)
	})
}

// A Load that fails one shard loads the rest, and a later Load that reads
// it replaces the copy whole.
func TestLoad(t *testing.T) {
	s := newFaulty()
	a, b := "role-a", otherShard("role-a")
	putShard(t, s, shardOf(a), map[string]Item{a: item(1)})
	putShard(t, s, shardOf(b), map[string]Item{b: item(2)})
	// Not shards: ignored.
	for _, k := range []string{"x", "512", "-1", "7/"} {
		if err := s.Put(ctx, &logical.StorageEntry{Key: Prefix + k, Value: []byte("not json")}); err != nil {
			t.Fatal(err)
		}
	}
	s.failNext("get "+shardPath(shardOf(b)), 1)
	x := New()
	var seen []string
	err := x.Load(ctx, s, func(keys []string, f func(string)) {
		for _, k := range keys {
			seen = append(seen, k)
			f(k)
		}
	})
	if !errors.Is(err, errInjected) {
		t.Fatalf("Load = %v, want the read error", err)
	}
	if len(seen) != 6 {
		t.Errorf("each was given %v, want every listed key", seen)
	}
	if got := x.Entries(); !maps.Equal(got, map[string]Item{a: item(1)}) {
		t.Fatalf("Entries = %v", got)
	}
	if !x.shards[shardOf(a)].loaded || x.shards[shardOf(b)].loaded {
		t.Fatal("wrong shards loaded")
	}
	for i := range x.shards {
		if i != shardOf(b) && !x.shards[i].loaded {
			t.Fatalf("shard %d, absent from storage, not loaded", i)
		}
	}

	// A change this node made is replaced by what storage says.
	x.Set(ctx, s, a, item(5).Next(), item(5).Exp())
	putShard(t, s, shardOf(a), map[string]Item{a: item(6)})
	if err := x.Load(ctx, s, nil); err != nil {
		t.Fatal(err)
	}
	if got := x.Entries(); !maps.Equal(got, map[string]Item{a: item(6), b: item(2)}) {
		t.Fatalf("Entries after the second Load = %v", got)
	}
	if x.shards[shardOf(a)].dirty {
		t.Error("a freshly loaded shard is dirty")
	}
}

// The first and the last shard (Prefix+"0", Prefix+"511") load like any
// other: a bound off by one would drop every hint of one of them.
func TestLoadFirstAndLastShards(t *testing.T) {
	s := newFaulty()
	first, last := keysIn(0, 1, "k")[0], keysIn(Shards-1, 1, "k")[0]
	putShard(t, s, 0, map[string]Item{first: item(1)})
	putShard(t, s, Shards-1, map[string]Item{last: item(2)})
	x := loaded(t, s)
	if got := x.Entries(); !maps.Equal(got, map[string]Item{first: item(1), last: item(2)}) {
		t.Fatalf("Entries = %v, want %s in shard 0 and %s in shard %d", got, first, last, Shards-1)
	}
}

// Repair makes the index say what the pass found, except for keys the pass
// could not vouch for (skip) and keys changed after its mark.
func TestRepair(t *testing.T) {
	s := newFaulty()
	x := loaded(t, s)
	set := func(k string, sec int) { x.Set(ctx, s, k, item(sec).Next(), item(sec).Exp()) }
	set("stale", 1)     // the pass found it cold: removed
	set("unreached", 2) // the pass could not read it: kept
	set("wrong", 3)     // the pass found another plan: replaced
	set("dropped", 4)   // dropped before the mark: stays dropped
	x.Drop(ctx, s, "dropped")
	since := x.Mark()
	want := map[string]Item{"wrong": item(30), "missing": item(40), "later": item(50), "gone-later": item(60)}
	set("later", 51)             // committed after the mark: wins
	x.Drop(ctx, s, "gone-later") // dropped after the mark: stays dropped
	set("new-later", 70)         // created after the mark: kept
	skip := func(k string) bool { return k == "unreached" || k == "missing" }
	if err := x.Repair(ctx, s, since, want, skip); err != nil {
		t.Fatal(err)
	}
	exp := map[string]Item{"unreached": item(2), "wrong": item(30), "missing": item(40), "later": item(51), "new-later": item(70)}
	if got := x.Entries(); !maps.Equal(got, exp) {
		t.Errorf("Entries = %v,\nwant %v", got, exp)
	}
	if got, _ := storedAll(t, s); !maps.Equal(got, exp) {
		t.Errorf("storage = %v,\nwant %v", got, exp)
	}

	// The next Repair forgets the marks it has seen: a view taken after
	// them wins.
	since = x.Mark()
	if err := x.Repair(ctx, s, since, map[string]Item{"later": item(52)}, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if got, _ := storedAll(t, s); !maps.Equal(got, map[string]Item{"later": item(52)}) {
		t.Errorf("after the second Repair storage = %v", got)
	}
	for i := range x.shards {
		if x.shards[i].touched != nil {
			t.Fatalf("shard %d keeps %d touched keys after a Repair that saw them", i, len(x.shards[i].touched))
		}
	}

	// A Repair that changes nothing writes nothing.
	before := maps.Clone(s.writes)
	if err := x.Repair(ctx, s, x.Mark(), map[string]Item{"later": item(52)}, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(s.writes, before) {
		t.Error("a Repair with nothing to change wrote")
	}
}

// A Repair whose write fails returns the error, keeps its view in this
// node's copy (dirty) and writes it at the next chance.
func TestRepairWriteFails(t *testing.T) {
	s := newFaulty()
	x := loaded(t, s)
	a, b := "role-a", otherShard("role-a")
	s.failNext("put "+shardPath(shardOf(a)), 1)
	err := x.Repair(ctx, s, x.Mark(), map[string]Item{a: item(1), b: item(2)}, func(string) bool { return false })
	if !errors.Is(err, errInjected) {
		t.Fatalf("Repair = %v, want the write error", err)
	}
	got, _ := storedAll(t, s)
	if !maps.Equal(got, map[string]Item{b: item(2)}) {
		t.Fatalf("storage = %v, want the other shard written", got)
	}
	if !x.shards[shardOf(a)].dirty {
		t.Fatal("the shard whose write failed is not dirty")
	}
	if got := x.Entries(); !maps.Equal(got, map[string]Item{a: item(1), b: item(2)}) {
		t.Errorf("Entries = %v", got)
	}
	if err := x.Repair(ctx, s, x.Mark(), map[string]Item{a: item(1), b: item(2)}, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if got, _ := storedAll(t, s); !maps.Equal(got, map[string]Item{a: item(1), b: item(2)}) {
		t.Errorf("storage after the second Repair = %v", got)
	}

	// An unloaded shard whose Repair write fails stays unloaded.
	y := New()
	s.failNext("put "+shardPath(shardOf(a)), 1)
	if err := y.Repair(ctx, s, y.Mark(), map[string]Item{a: item(7)}, func(string) bool { return false }); err == nil {
		t.Fatal("Repair hid the write error")
	}
	if y.shards[shardOf(a)].loaded {
		t.Fatal("a shard whose Repair write failed counts as loaded")
	}
	y.Set(ctx, s, a, item(8).Next(), item(8).Exp())
	if got := stored(t, s, shardOf(a))[a]; got != item(1) {
		t.Errorf("storage has %v for the unloaded shard, want the old %v", got, item(1))
	}
}

// Set, Drop and Repair may run at once (commits during a pass); each shard
// ends as the last change said. Run with -race.
func TestConcurrentChanges(t *testing.T) {
	s := new(logical.InmemStorage)
	x := loaded(t, s)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 50 {
				k := fmt.Sprintf("w%d-%d", w, j)
				x.Set(ctx, s, k, item(j).Next(), item(j).Exp())
				if j%2 == 1 {
					x.Drop(ctx, s, k)
				}
			}
		}()
	}
	since := x.Mark()
	if err := x.Repair(ctx, s, since, nil, func(string) bool { return true }); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	got, _ := storedAll(t, s)
	if len(got) != 8*25 {
		t.Errorf("%d entries stored, want %d", len(got), 8*25)
	}
	if !maps.Equal(got, x.Entries()) {
		t.Error("storage and this node's copy disagree")
	}
	keys := make([]string, 0, len(got))
	for k := range got {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		var w, j int
		if _, err := fmt.Sscanf(k, "w%d-%d", &w, &j); err != nil || j%2 == 1 || got[k] != item(j) {
			t.Fatalf("entry %s = %v", k, got[k])
		}
	}
}

// The shard is chosen by the whole key: the entity credentials of one role
// spread over the shards instead of sharing the role's.
func TestShardByWholeKey(t *testing.T) {
	seen := map[int]bool{}
	for j := range 200 {
		seen[shardOf(fmt.Sprintf("team/%08x-0000-4000-8000-%012x", j, j))] = true
	}
	if len(seen) < 100 {
		t.Errorf("200 entity keys of one role fall in %d shards, want them spread", len(seen))
	}
	for _, k := range []string{"", "a", "team", "team/x"} {
		if i := shardOf(k); i < 0 || i >= Shards {
			t.Errorf("shardOf(%q) = %d", k, i)
		}
	}
	// The layout is on disk: a change of hash moves every entry (which Load
	// handles, at the cost of rewriting every shard once).
	for k, want := range map[string]int{"team": 188, "team/11111111-1111-1111-1111-111111111111": 158, "": 11} {
		if got := shardOf(k); got != want {
			t.Errorf("shardOf(%q) = %d, want %d", k, got, want)
		}
	}
}

// entrySize adds up to the shard's exact JSON encoding, whatever the key.
func TestEntrySizeIsExact(t *testing.T) {
	// Keys of one special character alone too: in a longer key another
	// character already sends quotedLen to encoding/json, so only these
	// show that each character is recognised by itself.
	keys := []string{"r", "team/11111111-1111-1111-1111-111111111111", `q"uote`, `back\slash`, "<a&b>", "new\nline", "ctl\x01", "tab\t",
		"caf\u00e9", "bad\x80byte", "del\x7f", "line\u2028sep", " space~",
		`"`, `\`, "<", ">", "&", "\x01", "\x80", "\u00e9"}
	nums := []int64{0, 1, -1, 9, 10, 1_800_000_000_000_000_000, -1_800_000_000_000_000_000, 1<<63 - 1, -1 << 63}
	for _, k := range keys {
		for _, a := range nums {
			for _, b := range nums[:3] {
				one := map[string]Item{k: {a, b}}
				enc, err := json.Marshal(one)
				if err != nil {
					t.Fatal(err)
				}
				if got := 1 + entrySize(k, Item{a, b}); got != len(enc) {
					t.Fatalf("size of %s computed as %d, encoded %d", enc, got, len(enc))
				}
			}
		}
	}
	all := map[string]Item{}
	for j, k := range keys {
		all[k] = Item{nums[j%len(nums)], nums[(j+3)%len(nums)]}
	}
	enc, _ := json.Marshal(all)
	if size, left := fit(all); left != 0 || 1+size != len(enc) {
		t.Errorf("fit = %d, %d; want %d, 0", size, left, len(enc)-1)
	}
}

// checkSize asserts that every shard's tracked size is its encoding's, and
// that storage holds no shard over the bound.
func checkSize(t *testing.T, x *Index, s logical.Storage) {
	t.Helper()
	for i := range x.shards {
		sh := &x.shards[i]
		if len(sh.items) == 0 {
			if sh.size != 0 {
				t.Fatalf("empty shard %d has size %d", i, sh.size)
			}
			continue
		}
		enc, _ := json.Marshal(sh.items)
		if 1+sh.size != len(enc) {
			t.Fatalf("shard %d: size %d tracked, %d encoded", i, 1+sh.size, len(enc))
		}
		if len(enc) > MaxShardBytes {
			t.Fatalf("shard %d holds %d bytes in memory", i, len(enc))
		}
	}
	if s == nil {
		return
	}
	keys, _ := s.List(ctx, Prefix)
	for _, k := range keys {
		if e, _ := s.Get(ctx, Prefix+k); e != nil && len(e.Value) > MaxShardBytes {
			t.Fatalf("shard %s holds %d bytes in storage", k, len(e.Value))
		}
	}
}

// fill sets long keys in shard i until one is left out; it returns the keys
// that fit and the first that did not.
func fill(t *testing.T, x *Index, s logical.Storage, i int) ([]string, string) {
	t.Helper()
	pad := string(make([]byte, 2000))
	pad = strings.Repeat("p", len(pad))
	var in []string
	for j := 0; ; j++ {
		k := pad + strconv.Itoa(j)
		if shardOf(k) != i {
			continue
		}
		before := x.Stats().LeftOut
		x.Set(ctx, s, k, item(j).Next(), item(j).Exp())
		if x.Stats().LeftOut != before {
			return in, k
		}
		in = append(in, k)
	}
}

// A shard never grows past MaxShardBytes: an entry that would push it past
// is left out and counted; room made by a Drop takes it.
func TestSetBoundsTheShard(t *testing.T) {
	s := newFaulty()
	x := loaded(t, s)
	in, out := fill(t, x, s, 0)
	checkSize(t, x, s)
	if n := len(in); n < MaxShardBytes/2100 || n > MaxShardBytes/2000 {
		t.Fatalf("%d keys of 2 KB fit, want about %d", n, MaxShardBytes/2050)
	}
	if st := x.Stats(); st.LeftOut != 1 {
		t.Errorf("LeftOut = %d, want 1", st.LeftOut)
	}
	got := stored(t, s, 0)
	if _, ok := got[out]; ok || len(got) != len(in) {
		t.Fatalf("storage holds %d entries (the one left out: %v), want %d", len(got), ok, len(in))
	}
	if _, ok := x.Entries()[out]; ok {
		t.Error("this node's copy holds the entry left out")
	}
	// The last that fit may change to an entry of the same size.
	last := in[len(in)-1]
	x.Set(ctx, s, last, item(7).Next(), item(7).Exp())
	if stored(t, s, 0)[last] != item(7) {
		t.Error("an entry that still fits was not replaced")
	}
	// Growing an entry past the bound removes it: no stale hint is left.
	// last loses its expiry (18 digits shorter), and a filler takes all but
	// 5 bytes of the room left.
	x.Set(ctx, s, last, item(7).Next(), time.Time{})
	slack := MaxShardBytes - 1 - x.shards[0].size
	n := slack - 5 - entrySize("", Item{item(0)[0], 0})
	var filler string
	for j := 0; filler == "" || shardOf(filler) != 0; j++ {
		filler = fmt.Sprintf("%0*d", n, j)
	}
	x.Set(ctx, s, filler, item(0).Next(), time.Time{})
	if room := MaxShardBytes - 1 - x.shards[0].size; room != 5 {
		t.Fatalf("room left %d, want 5", room)
	}
	x.Set(ctx, s, last, item(7).Next(), item(7).Exp())
	if _, ok := stored(t, s, 0)[last]; ok {
		t.Error("an entry that grew past the bound is still stored")
	}
	if st := x.Stats(); st.LeftOut != 2 {
		t.Errorf("LeftOut = %d, want 2", st.LeftOut)
	}
	checkSize(t, x, s)
	// A Drop makes room.
	x.Drop(ctx, s, in[0])
	x.Set(ctx, s, out, item(9).Next(), item(9).Exp())
	if stored(t, s, 0)[out] != item(9) {
		t.Error("an entry that fits after a Drop was left out")
	}
	checkSize(t, x, s)
}

// Repair cuts a shard that its pass would fill past the bound, keeping the
// entries first in key order, and a second pass with the same view writes
// nothing.
func TestRepairBoundsTheShard(t *testing.T) {
	s := newFaulty()
	x := loaded(t, s)
	pad := strings.Repeat("p", 2000)
	want := map[string]Item{}
	var names []string
	for j := 0; len(names) < MaxShardBytes/2000+20; j++ {
		if k := fmt.Sprintf("%s%06d", pad, j); shardOf(k) == 5 {
			names = append(names, k)
			want[k] = item(j)
		}
	}
	other := otherShard(names[0])
	want[other] = item(1)
	if err := x.Repair(ctx, s, x.Mark(), want, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	checkSize(t, x, s)
	got := stored(t, s, 5)
	left := len(names) - len(got)
	if left < 20 || uint64(left) != x.Stats().LeftOut {
		t.Fatalf("%d left out, LeftOut = %d", left, x.Stats().LeftOut)
	}
	sort.Strings(names)
	for j, k := range names {
		if _, ok := got[k]; ok != (j < len(got)) {
			t.Fatalf("entry %d in key order stored: %v; want the first %d kept", j, ok, len(got))
		}
	}
	if stored(t, s, shardOf(other))[other] != item(1) {
		t.Error("the other shard was not written")
	}
	before := maps.Clone(s.writes)
	if err := x.Repair(ctx, s, x.Mark(), want, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(before, s.writes) {
		t.Error("a second pass with the same view wrote again")
	}
}

// oldShardOf is the shard the old layout chose: plain FNV-1a of the role.
func oldShardOf(role string) int {
	h := fnv.New32a()
	h.Write([]byte(role))
	return int(h.Sum32() % Shards)
}

// Shards written by the old layout (a role's entity credentials in the
// role's shard) load whole: every entry moves to its own shard, in memory at
// once and in storage at the next write of each shard.
func TestLoadOldLayout(t *testing.T) {
	oldShard := oldShardOf("team")
	old := map[string]Item{"team": item(0)}
	for j := range 60 {
		old[fmt.Sprintf("team/%08x-0000-4000-8000-%012x", j, j)] = item(j + 1)
	}
	// One entry's own shard has an entry for it already (written by this
	// layout): that one wins.
	var clash string
	for k := range old {
		if k != "team" && shardOf(k) != oldShard {
			clash = k
			break
		}
	}
	s := newFaulty()
	putShard(t, s.Storage, oldShard, old)
	putShard(t, s.Storage, shardOf(clash), map[string]Item{clash: item(99)})
	x := loaded(t, s)
	wantAll := maps.Clone(old)
	wantAll[clash] = item(99)
	if got := x.Entries(); !maps.Equal(got, wantAll) {
		t.Fatalf("Entries after loading the old layout: %d entries, want %d", len(got), len(wantAll))
	}
	checkSize(t, x, s)
	moved := 0
	for k := range old {
		if i := shardOf(k); i != oldShard {
			moved++
			if k != clash && !x.shards[i].dirty {
				t.Fatalf("shard %d took an entry but is not dirty", i)
			}
		}
	}
	if moved < 55 || !x.shards[oldShard].dirty {
		t.Fatalf("%d entries moved; old shard dirty: %v", moved, x.shards[oldShard].dirty)
	}
	// The pass that follows keeps what it cannot vouch for, and writes the
	// layout out.
	if err := x.Repair(ctx, s, x.Mark(), nil, func(string) bool { return true }); err != nil {
		t.Fatal(err)
	}
	got, where := storedAll(t, s)
	if !maps.Equal(got, wantAll) {
		t.Fatalf("storage after the pass: %d entries, want %d", len(got), len(wantAll))
	}
	for k, shards := range where {
		if len(shards) != 1 || shards[0] != shardOf(k) {
			t.Fatalf("%s stored in shards %v, want only %d", k, shards, shardOf(k))
		}
	}
}

// An old-layout entry whose own shard could not be read is left out (that
// shard is planned by the pass), and the shard it sat in drops it.
func TestLoadOldLayoutOwnShardUnread(t *testing.T) {
	old := oldShardOf("team")
	key := "team/one"
	for j := 0; shardOf(key) == old || shardOf(key) == shardOf("team"); j++ {
		key = "team/" + strconv.Itoa(j)
	}
	s := newFaulty()
	putShard(t, s.Storage, old, map[string]Item{"team": item(0), key: item(1)})
	putShard(t, s.Storage, shardOf(key), map[string]Item{})
	s.failNext("get "+shardPath(shardOf(key)), 1)
	x := New()
	if err := x.Load(ctx, s, nil); !errors.Is(err, errInjected) {
		t.Fatalf("Load = %v", err)
	}
	if got := x.Entries(); !maps.Equal(got, map[string]Item{"team": item(0)}) {
		t.Fatalf("Entries = %v", got)
	}
	// "team" moved too; the old shard, now empty, is deleted at its next
	// write.
	x.Drop(ctx, s, keysIn(old, 1, "x")[0])
	if got := stored(t, s, old); got != nil {
		t.Errorf("old shard after its next write = %v", got)
	}
	x.Set(ctx, s, "team", item(2).Next(), item(2).Exp())
	if got := stored(t, s, shardOf("team")); !maps.Equal(got, map[string]Item{"team": item(2)}) {
		t.Errorf("team's shard = %v", got)
	}
}

// An old shard past the bound (raft took up to 1 MiB) loads cut to it.
func TestLoadCutsAnOversizedShard(t *testing.T) {
	s := newFaulty()
	pad := strings.Repeat("p", 2000)
	big := map[string]Item{}
	for j := 0; len(big) < MaxShardBytes/2000+10; j++ {
		if k := fmt.Sprintf("%s%06d", pad, j); shardOf(k) == 9 {
			big[k] = item(j)
		}
	}
	putShard(t, s.Storage, 9, big)
	x := loaded(t, s)
	checkSize(t, x, nil)
	n := len(x.Entries())
	if n >= len(big) || uint64(len(big)-n) != x.Stats().LeftOut || !x.shards[9].dirty {
		t.Fatalf("%d of %d entries kept, LeftOut %d, dirty %v", n, len(big), x.Stats().LeftOut, x.shards[9].dirty)
	}
	if err := x.Repair(ctx, s, x.Mark(), nil, func(string) bool { return true }); err != nil {
		t.Fatal(err)
	}
	checkSize(t, x, s)
	if got := stored(t, s, 9); len(got) != n {
		t.Errorf("stored %d entries, want the %d kept", len(got), n)
	}
}

// Every failed shard write is counted, whoever made it.
func TestWriteFailuresCounted(t *testing.T) {
	s := newFaulty()
	x := loaded(t, s)
	s.failNext("put", 1)
	x.Set(ctx, s, "a", item(1).Next(), item(1).Exp())
	x.Set(ctx, s, "a", item(1).Next(), item(1).Exp()) // writes the dirty shard
	s.failNext("delete", 1)
	x.Drop(ctx, s, "a")
	s.failNext("delete", 1)
	if err := x.Repair(ctx, s, x.Mark(), nil, func(string) bool { return false }); err == nil {
		t.Fatal("Repair hid its write error")
	}
	if st := x.Stats(); st.WriteFailures != 3 || st.LeftOut != 0 {
		t.Errorf("Stats = %+v, want 3 write failures", st)
	}
}

// BenchmarkIndexShardWrite: what a commit pays to write its shard (encoding it
// whole) with 1000 and 100 000 keys over the 512 shards.
func BenchmarkIndexShardWrite(b *testing.B) {
	for _, keys := range []int{1000, 100000} {
		b.Run(fmt.Sprintf("roles=%d", keys), func(b *testing.B) {
			x := New()
			s := new(logical.InmemStorage)
			if err := x.Load(ctx, s, nil); err != nil {
				b.Fatal(err)
			}
			names := keysIn(0, keys/Shards+1, "role-")
			for i, k := range names {
				x.Set(ctx, s, k, t0.Add(time.Duration(i)*time.Second), t0.Add(time.Hour))
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				x.Set(ctx, s, names[0], t0.Add(time.Duration(i)*time.Second), t0.Add(time.Hour))
			}
		})
	}
}

// Another node's write to a shard (an old active still committing after a
// failover) leaves this node's copy agreeing with its own plan but not with
// storage: after Forget of that shard's path, the next Repair writes this
// node's view again; Forget of any other path changes nothing.
func TestForgetRewritesAShardAnotherNodeWrote(t *testing.T) {
	s := newFaulty()
	x := loaded(t, s)
	x.Set(ctx, s, "r2", item(10).Next(), item(10).Exp())
	i := shardOf("r2")
	putShard(t, s, i, map[string]Item{"r2": item(15)}) // the other node's write
	want := map[string]Item{"r2": item(10)}
	none := func(string) bool { return false }

	for _, other := range []string{"roles/r2", Prefix + "x", Prefix + strconv.Itoa(Shards), "cache/" + shardPath(i)} {
		x.Forget(other)
	}
	if err := x.Repair(ctx, s, x.Mark(), want, none); err != nil {
		t.Fatal(err)
	}
	if got := stored(t, s, i); !maps.Equal(got, map[string]Item{"r2": item(15)}) {
		t.Fatalf("a Forget of another path made Repair write: storage has %v", got)
	}

	x.Forget(shardPath(i))
	if err := x.Repair(ctx, s, x.Mark(), want, none); err != nil {
		t.Fatal(err)
	}
	if got := stored(t, s, i); !maps.Equal(got, want) {
		t.Fatalf("after Forget of %s, Repair left storage at %v, want this node's view %v", shardPath(i), got, want)
	}
}

// keyOfSize returns a key of shard i, beginning with prefix, whose entry
// with it adds exactly size bytes to the shard's encoding.
func keyOfSize(i int, prefix string, size int, it Item) string {
	n := size - entrySize(prefix, it)
	for j := 0; ; j++ {
		if k := fmt.Sprintf("%s%0*d", prefix, n, j); shardOf(k) == i {
			return k
		}
	}
}

// An entry that brings a shard to exactly MaxShardBytes fits, whether Set
// or Repair's cut puts it there; one byte more does not.
func TestShardFilledToTheExactBound(t *testing.T) {
	s := newFaulty()
	x := loaded(t, s)
	fill(t, x, s, 0)
	it := item(1)
	exact := keyOfSize(0, "q", MaxShardBytes-1-x.shards[0].size, it)
	x.Set(ctx, s, exact, it.Next(), it.Exp())
	if stored(t, s, 0)[exact] != it {
		t.Fatal("Set left out an entry that fills the shard to exactly MaxShardBytes")
	}
	if size := x.shards[0].size; 1+size != MaxShardBytes {
		t.Fatalf("shard size %d, want %d", 1+size, MaxShardBytes)
	}

	// Repair's cut keeps entries in key order up to the bound: the "p..."
	// fillers and exact fill it to the byte, and the last key is left out.
	want := x.Entries()
	last := keyOfSize(0, "z", 40, it)
	want[last] = it
	before := x.Stats().LeftOut
	if err := x.Repair(ctx, s, x.Mark(), want, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	got := stored(t, s, 0)
	if _, ok := got[exact]; !ok {
		t.Error("Repair's cut left out the entry that fills the shard to exactly MaxShardBytes")
	}
	if _, ok := got[last]; ok {
		t.Error("Repair stored an entry past the bound")
	}
	if n := x.Stats().LeftOut - before; n != 1 {
		t.Errorf("Repair left out %d entries, want 1", n)
	}
	checkSize(t, x, s)
}
