// Package shrink gives back the memory of Go maps that once held many
// more entries than they hold now. A Go map never shrinks: one that held
// a thousand sandboxes keeps their buckets after they are gone, and
// maps.Clone keeps them too (it copies the tables as they are). Issue 21:
// the daemon's memory after its sandboxes are removed.
package shrink

// minPeak is the size below which a map is left alone: its buckets are
// small.
const minPeak = 64

// Map returns m, or a copy of it sized for what it holds once that has
// fallen to a quarter of *peak, the most it held. Call it after each
// delete from m: it takes m's size before the delete as a candidate for
// *peak, which sees every growth at the first delete that follows it.
// The copy costs one pass over what is left, once per fall to a quarter.
func Map[M ~map[K]V, K comparable, V any](m M, peak *int) M {
	*peak = max(*peak, len(m)+1)
	if *peak < minPeak || len(m) > *peak/4 {
		return m
	}
	fresh := make(M, len(m))
	for k, v := range m {
		fresh[k] = v
	}
	*peak = len(m)
	return fresh
}
