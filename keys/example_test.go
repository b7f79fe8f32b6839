package keys_test

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"agentkit/keys"
)

func ExampleSegment() {
	for _, raw := range []string{"slack", "C0123/thread 1", "héllo", strings.Repeat("a", 257)} {
		seg, _ := keys.Segment(raw)
		fmt.Println(seg)
	}
	// Output:
	// slack
	// C0123%2Fthread%201
	// h%C3%A9llo
	// sha256:e8d95cc2b4bc198c54b40bd214df958afb65f5e73d2c2eafe0593cf5c635c1f0
}

func ExampleUnsegment() {
	raw, err := keys.Unsegment("C0123%2Fthread%201")
	fmt.Println(raw, err)

	_, err = keys.Unsegment("sha256:e8d95cc2b4bc198c54b40bd214df958afb65f5e73d2c2eafe0593cf5c635c1f0")
	fmt.Println(errors.Is(err, keys.ErrDigest))
	// Output:
	// C0123/thread 1 <nil>
	// true
}

func ExampleAgent() {
	k, err := keys.Agent("support")
	if err != nil {
		panic(err)
	}
	meta, _ := k.SessionMeta("C0123/thread 1")
	batch, _ := k.EventBatch("C0123/thread 1", 3)
	author, _ := k.AuthorKV("alert-memory/abc")
	sample, _ := k.ABSample("tone", "s1", time.Date(2024, 5, 1, 12, 30, 0, 123e6, time.UTC))
	fmt.Println(meta)
	fmt.Println(batch)
	fmt.Println(author)
	fmt.Println(sample)
	fmt.Println(k.SessionsPrefix())
	// Output:
	// agentkit/v1/support/sessions/C0123%2Fthread%201/meta
	// agentkit/v1/support/sessions/C0123%2Fthread%201/events/00000000000000000003
	// agentkit/v1/support/kv/alert-memory%2Fabc
	// agentkit/v1/support/ab-samples/tone/s1/2024-05-01T12%3A30%3A00.123Z
	// agentkit/v1/support/sessions/
}

func ExampleScope_SessionMeta() {
	k, _ := keys.Agent("support")
	_, err := k.SessionMeta("")
	fmt.Println(err)
	// Output:
	// keys: empty segment: the session id is empty; give a non-empty session id
}

func ExampleParse() {
	k, _ := keys.Agent("support")
	batch, _ := k.EventBatch("C0123/thread 1", 12)

	p, err := keys.Parse(batch)
	if err != nil {
		panic(err)
	}
	id, _ := keys.Unsegment(p.Session)
	fmt.Println(p.Family, id, p.Batch)
	// Output:
	// session event batch C0123/thread 1 12
}
