package main

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// summary describes one set of timed samples. Percentiles use the
// nearest-rank method on the sorted samples; the median of an even count is
// the mean of the two middle samples.
type summary struct {
	N      int
	Median time.Duration
	P90    time.Duration
	P99    time.Duration
	Min    time.Duration
	Max    time.Duration
}

func summarize(samples []time.Duration) summary {
	if len(samples) == 0 {
		return summary{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	return summary{
		N:      len(s),
		Median: median(s),
		P90:    percentile(s, 90),
		P99:    percentile(s, 99),
		Min:    s[0],
		Max:    s[len(s)-1],
	}
}

// median of sorted samples.
func median(sorted []time.Duration) time.Duration {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// percentile of sorted samples by nearest rank: the smallest sample with at
// least p% of the samples at or below it.
func percentile(sorted []time.Duration, p float64) time.Duration {
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

func seconds(d time.Duration) string {
	return fmt.Sprintf("%.2f s", d.Seconds())
}

// ratio formats a/b, "n/a" when b is missing.
func ratio(a, b time.Duration) string {
	if a <= 0 || b <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f×", float64(a)/float64(b))
}

// mib formats a byte count in MiB, or in KiB below 1 MiB.
func mib(bytes int64) string {
	if bytes > -1<<20 && bytes < 1<<20 {
		return fmt.Sprintf("%d KiB", bytes>>10)
	}
	return fmt.Sprintf("%.1f MiB", float64(bytes)/(1<<20))
}
