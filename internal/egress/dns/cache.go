package dns

import (
	"container/list"
	"fmt"
	"net/netip"
	"sync"
	"time"

	mdns "github.com/miekg/dns"
)

type cacheKey struct {
	name  string
	qtype uint16
}

func (k cacheKey) String() string { return fmt.Sprintf("%s/%d", k.name, k.qtype) }

// entry is one cached answer. It is never changed once cached.
type entry struct {
	rcode   int
	rrs     []mdns.RR    // the answer: A/AAAA owned by the asked name, or upstream's records
	addrs   []netip.Addr // A/AAAA only
	expires time.Time
	ttl     time.Duration
}

func (e *entry) setExpiry(ttl time.Duration) {
	e.ttl = max(ttl, 0)
	e.expires = time.Now().Add(e.ttl)
}

// remaining is the TTL to answer with: what is left, in whole seconds,
// rounded up (an answer is never given TTL 0 while it is still cached).
func (e *entry) remaining(now time.Time) uint32 {
	left := e.expires.Sub(now)
	if left <= 0 {
		return 0
	}
	return uint32((left + time.Second - 1) / time.Second)
}

// cache is a bounded LRU of answers; entries expire at their (capped) TTL.
type cache struct {
	mu  sync.Mutex
	max int
	m   map[cacheKey]*list.Element
	lru *list.List // front: most recently used; values are *cached
}

type cached struct {
	key cacheKey
	e   *entry
}

func newCache(max int) *cache {
	return &cache{max: max, m: map[cacheKey]*list.Element{}, lru: list.New()}
}

func (c *cache) get(k cacheKey, now time.Time) (*entry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.m[k]
	if !ok {
		return nil, false
	}
	v := el.Value.(*cached)
	if !now.Before(v.e.expires) {
		c.lru.Remove(el)
		delete(c.m, k)
		return nil, false
	}
	c.lru.MoveToFront(el)
	return v.e, true
}

// put caches e unless its TTL is zero, evicting the least recently used
// entry when full.
func (c *cache) put(k cacheKey, e *entry) {
	if e.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.m[k]; ok {
		el.Value.(*cached).e = e
		c.lru.MoveToFront(el)
		return
	}
	c.m[k] = c.lru.PushFront(&cached{key: k, e: e})
	for c.lru.Len() > c.max {
		old := c.lru.Back()
		c.lru.Remove(old)
		delete(c.m, old.Value.(*cached).key)
	}
}

func (c *cache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}
