package bmdb_test

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/shepherd-fleet/shepherd/internal/bmdb"
)

// sequence returns the intervals persisted by n consecutive failures, the
// first one finding no backoff row (previous 0).
func sequence(b bmdb.Backoff, n int) []int64 {
	var out []int64
	var previous int64
	for range n {
		previous = b.NextSeconds(previous)
		out = append(out, previous)
	}
	return out
}

func TestBackoffNextSeconds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		b    bmdb.Backoff
		want []int64
	}{
		{
			name: "exponent 2 capped at 5s",
			b:    bmdb.Backoff{Initial: time.Second, Maximum: 5 * time.Second, Exponent: 2},
			want: []int64{1, 2, 4, 5, 5, 5},
		},
		{
			// Rounding up every step is what keeps a small exponent from
			// being stuck at 1 s.
			name: "exponent 1.1 is never stuck",
			b:    bmdb.Backoff{Initial: time.Second, Maximum: time.Hour, Exponent: 1.1},
			want: []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17},
		},
		{
			name: "zero backoff is a constant second",
			b:    bmdb.Backoff{},
			want: []int64{1, 1, 1, 1},
		},
		{
			name: "exponent 1 is a constant initial",
			b:    bmdb.Backoff{Initial: 3 * time.Second, Maximum: time.Minute, Exponent: 1},
			want: []int64{3, 3, 3},
		},
		{
			name: "exponent below 1 is raised to 1",
			b:    bmdb.Backoff{Initial: 3 * time.Second, Maximum: time.Minute, Exponent: 0.5},
			want: []int64{3, 3, 3},
		},
		{
			name: "negative exponent is raised to 1",
			b:    bmdb.Backoff{Initial: 2 * time.Second, Maximum: time.Minute, Exponent: -3},
			want: []int64{2, 2},
		},
		{
			name: "NaN exponent is raised to 1",
			b:    bmdb.Backoff{Initial: 2 * time.Second, Maximum: time.Minute, Exponent: math.NaN()},
			want: []int64{2, 2},
		},
		{
			name: "initial below 1s is raised to 1s",
			b:    bmdb.Backoff{Initial: 100 * time.Millisecond, Maximum: 10 * time.Second, Exponent: 3},
			want: []int64{1, 3, 9, 10, 10},
		},
		{
			name: "negative initial is raised to 1s",
			b:    bmdb.Backoff{Initial: -time.Hour, Maximum: 4 * time.Second, Exponent: 2},
			want: []int64{1, 2, 4, 4},
		},
		{
			name: "maximum below initial is raised to initial",
			b:    bmdb.Backoff{Initial: 7 * time.Second, Maximum: time.Second, Exponent: 2},
			want: []int64{7, 7, 7},
		},
		{
			name: "fractional seconds round up",
			b:    bmdb.Backoff{Initial: 1500 * time.Millisecond, Maximum: 10500 * time.Millisecond, Exponent: 2},
			want: []int64{2, 4, 8, 11, 11},
		},
		{
			name: "AgentStart default",
			b:    bmdb.Backoff{Initial: 5 * time.Minute, Maximum: 4 * time.Hour, Exponent: 1.2},
			want: []int64{300, 360, 432, 519, 623, 748, 898, 1078, 1294, 1553, 1864, 2237, 2685, 3222, 3867, 4641, 5570, 6684, 8021, 9626, 11552, 13863, 14400, 14400},
		},
		{
			name: "huge exponent saturates at maximum",
			b:    bmdb.Backoff{Initial: time.Second, Maximum: time.Duration(math.MaxInt64), Exponent: math.MaxFloat64},
			want: nil, // checked below: positive and capped, never wrapping
		},
		{
			name: "infinite exponent saturates at maximum",
			b:    bmdb.Backoff{Initial: time.Second, Maximum: time.Hour, Exponent: math.Inf(1)},
			want: []int64{1, 3600, 3600},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.want == nil {
				got := sequence(tc.b, 4)
				for _, s := range got {
					if s < 1 || s > math.MaxInt64/int64(time.Second) {
						t.Fatalf("sequence %v: %d is out of range", got, s)
					}
				}
				if !slices.IsSorted(got) {
					t.Fatalf("sequence %v is not monotone", got)
				}
				return
			}
			if got := sequence(tc.b, len(tc.want)); !slices.Equal(got, tc.want) {
				t.Errorf("consecutive failures persist %v, want %v", got, tc.want)
			}
		})
	}
}

// After a success the row is gone and the next failure starts from Initial.
func TestBackoffRestartsAfterSuccess(t *testing.T) {
	t.Parallel()
	b := bmdb.Backoff{Initial: time.Second, Maximum: 5 * time.Second, Exponent: 2}
	if got, want := sequence(b, 5), []int64{1, 2, 4, 5, 5}; !slices.Equal(got, want) {
		t.Fatalf("first run: %v, want %v", got, want)
	}
	if got, want := sequence(b, 2), []int64{1, 2}; !slices.Equal(got, want) {
		t.Fatalf("after success: %v, want %v", got, want)
	}
}

// A previous interval persisted under another configuration (the operator
// changed the flags) is brought back within the current bounds.
func TestBackoffForeignPrevious(t *testing.T) {
	t.Parallel()
	b := bmdb.Backoff{Initial: 10 * time.Second, Maximum: time.Minute, Exponent: 2}
	for _, tc := range []struct{ previous, want int64 }{
		{previous: 1, want: 10},             // below Initial: raised
		{previous: 3600, want: 60},          // above Maximum: capped
		{previous: -5, want: 10},            // corrupt: a first failure
		{previous: math.MaxInt64, want: 60}, // no overflow
		{previous: math.MinInt64, want: 10}, // no overflow
		{previous: 20, want: 40},            // within bounds: multiplied
		{previous: 59, want: 60},            // capped
		{previous: 60, want: 60},            // stays at Maximum
		{previous: 0, want: 10},             // no row: Initial
		{previous: 31, want: 60},            // 62 capped
		{previous: 11, want: 22},            // plain
		{previous: 29, want: 58},            // plain
		{previous: 30, want: 60},            // exactly Maximum
		{previous: 1 << 62, want: 60},       // huge
		{previous: math.MaxInt64 / 2, want: 60},
	} {
		if got := b.NextSeconds(tc.previous); got != tc.want {
			t.Errorf("NextSeconds(%d) = %d, want %d", tc.previous, got, tc.want)
		}
	}
}

func TestBackoffNormalize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		in, out bmdb.Backoff
	}{
		{
			name: "zero",
			in:   bmdb.Backoff{},
			out:  bmdb.Backoff{Initial: time.Second, Maximum: time.Second, Exponent: 1},
		},
		{
			name: "valid values are kept",
			in:   bmdb.Backoff{Initial: time.Minute, Maximum: time.Hour, Exponent: 1.2, Jitter: 0.25},
			out:  bmdb.Backoff{Initial: time.Minute, Maximum: time.Hour, Exponent: 1.2, Jitter: 0.25},
		},
		{
			name: "floors",
			in:   bmdb.Backoff{Initial: time.Millisecond, Maximum: -time.Second, Exponent: 0.9, Jitter: -1},
			out:  bmdb.Backoff{Initial: time.Second, Maximum: time.Second, Exponent: 1},
		},
		{
			name: "maximum below initial",
			in:   bmdb.Backoff{Initial: time.Hour, Maximum: time.Minute, Exponent: 2},
			out:  bmdb.Backoff{Initial: time.Hour, Maximum: time.Hour, Exponent: 2},
		},
		{
			name: "jitter above 1",
			in:   bmdb.Backoff{Initial: time.Second, Maximum: time.Second, Exponent: 1, Jitter: 7},
			out:  bmdb.Backoff{Initial: time.Second, Maximum: time.Second, Exponent: 1, Jitter: 1},
		},
		{
			name: "ceilings",
			in:   bmdb.Backoff{Initial: time.Duration(math.MaxInt64), Maximum: time.Duration(math.MaxInt64), Exponent: 2},
			out:  bmdb.Backoff{Initial: bmdb.MaxBackoff, Maximum: bmdb.MaxBackoff, Exponent: 2},
		},
		{
			name: "maximum above the ceiling",
			in:   bmdb.Backoff{Initial: time.Second, Maximum: time.Duration(math.MaxInt64), Exponent: 2},
			out:  bmdb.Backoff{Initial: time.Second, Maximum: bmdb.MaxBackoff, Exponent: 2},
		},
		{
			name: "NaN",
			in:   bmdb.Backoff{Initial: time.Second, Maximum: time.Second, Exponent: math.NaN(), Jitter: math.NaN()},
			out:  bmdb.Backoff{Initial: time.Second, Maximum: time.Second, Exponent: 1},
		},
	} {
		if got := tc.in.Normalize(); got != tc.out {
			t.Errorf("%s: %+v.Normalize() = %+v, want %+v", tc.name, tc.in, got, tc.out)
		}
	}
}

// ceilSeconds rounds a positive duration up to whole seconds, without
// overflow.
func ceilSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// FuzzBackoff checks the properties every backoff must have, whatever its
// configuration and whatever interval a previous failure persisted: at least
// a second, never above the (normalized) Maximum, never negative or wrapped,
// and monotone over consecutive failures: with an exponent above 1 it grows
// strictly until Maximum, then stays there; with exponent 1 it is the
// constant Initial.
func FuzzBackoff(f *testing.F) {
	f.Add(int64(time.Second), int64(5*time.Second), 2.0, int64(0), uint8(8))
	f.Add(int64(time.Second), int64(time.Hour), 1.1, int64(10), uint8(50))
	f.Add(int64(0), int64(0), 0.0, int64(0), uint8(3))
	f.Add(int64(5*time.Minute), int64(4*time.Hour), 1.2, int64(300), uint8(40))
	f.Add(int64(math.MaxInt64), int64(math.MaxInt64), math.MaxFloat64, int64(math.MaxInt64), uint8(255))
	f.Add(int64(-1), int64(math.MinInt64), math.Inf(-1), int64(math.MinInt64), uint8(2))
	f.Fuzz(func(t *testing.T, initial, maximum int64, exponent float64, previous int64, steps uint8) {
		b := bmdb.Backoff{Initial: time.Duration(initial), Maximum: time.Duration(maximum), Exponent: exponent}
		n := b.Normalize()
		if n.Initial < time.Second || n.Maximum < n.Initial || !(n.Exponent >= 1) {
			t.Fatalf("%+v.Normalize() = %+v: below a floor", b, n)
		}
		initS, maxS := ceilSeconds(n.Initial), ceilSeconds(n.Maximum)
		check := func(prev, next int64) {
			t.Helper()
			if next < 1 {
				t.Fatalf("%+v.NextSeconds(%d) = %d < 1", b, prev, next)
			}
			if next > maxS {
				t.Fatalf("%+v.NextSeconds(%d) = %d > Maximum %ds", b, prev, next, maxS)
			}
			if next > math.MaxInt64/int64(time.Second) {
				t.Fatalf("%+v.NextSeconds(%d) = %d overflows a time.Duration", b, prev, next)
			}
			switch {
			case n.Exponent == 1:
				// Constant, whatever an earlier configuration persisted.
				if next != initS {
					t.Fatalf("%+v.NextSeconds(%d) = %d, want the constant Initial %ds", b, prev, next, initS)
				}
			case prev >= initS && prev < maxS && next <= prev:
				t.Fatalf("%+v.NextSeconds(%d) = %d: not growing below Maximum", b, prev, next)
			case prev == maxS && next != maxS:
				t.Fatalf("%+v.NextSeconds(%d) = %d: left Maximum", b, prev, next)
			}
		}
		var prev int64
		for i := range int(steps) {
			next := b.NextSeconds(prev)
			if i == 0 && next != initS {
				t.Fatalf("%+v: first failure backs off %ds, want Initial %ds", b, next, initS)
			}
			check(prev, next)
			prev = next
		}
		check(previous, b.NextSeconds(previous))
	})
}
