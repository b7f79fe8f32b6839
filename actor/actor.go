package actor

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"

	"agentkit/internal/jsonerr"
)

// Class is a class of actors whose state has the Go type S (anything
// encoding/json can encode and decode). Define makes one.
type Class[S any] struct {
	h       *Host
	name    string
	initial func() S
}

// Define defines the class named name on h. initial gives a new actor's
// state (nil means S's zero value). The state type and the initial state
// are checked at once: S must survive a JSON round trip. Defining a name
// twice on one Host is ErrClassDefined.
func Define[S any](h *Host, name string, initial func() S) (*Class[S], error) {
	if initial == nil {
		initial = func() (s S) { return s }
	}
	c := &Class[S]{h: h, name: name, initial: initial}
	info := &classInfo{
		name: name,
		initial: func() ([]byte, error) {
			b, err := json.Marshal(c.initial())
			if err != nil {
				return nil, fmt.Errorf("%w: the initial state of class %q does not encode as JSON: %w", ErrInvalidState, name, err)
			}
			return b, nil
		},
		check: func(b []byte) error {
			_, err := decodeState[S](b)
			return err
		},
	}
	if b, err := info.initial(); err != nil {
		return nil, err
	} else if err := info.check(b); err != nil {
		return nil, fmt.Errorf("actor: class %q: the initial state does not decode back into %s: %w", name, typeName[S](), err)
	}
	if err := h.defineClass(info); err != nil {
		return nil, err
	}
	return c, nil
}

// Name returns the class name.
func (c *Class[S]) Name() string { return c.name }

// InitialState returns a new actor's state.
func (c *Class[S]) InitialState() S { return c.initial() }

// Actor returns the actor id of the class. It opens nothing: an actor that
// is only read never gets a database file.
func (c *Class[S]) Actor(id string) (*Actor[S], error) {
	c.h.mu.Lock()
	info := c.h.classes[c.name]
	c.h.mu.Unlock()
	r, err := c.h.ref(info, c.name, id)
	if err != nil {
		return nil, err
	}
	return &Actor[S]{Ref: r}, nil
}

// Actor is one actor of a Class, with typed state. The embedded Ref gives
// the JSON state, the logs, the scheduled tasks and the SQL database.
type Actor[S any] struct {
	*Ref
}

// State returns the actor's state: the stored value, or the class's
// initial state when nothing was stored.
func (a *Actor[S]) State(ctx context.Context) (S, error) {
	b, err := a.StateJSON(ctx)
	if err != nil {
		var zero S
		return zero, err
	}
	return decodeState[S](b)
}

// SetState applies patch, an RFC 7396 JSON merge patch, to the state and
// returns the new state: keys of the patch are merged in, nested objects
// merge recursively, null deletes a key, arrays and other values replace.
// The change is durable when SetState returns, and concurrent SetState
// calls on one actor never lose a patch. See Ref.PatchStateJSON for the
// errors.
func (a *Actor[S]) SetState(ctx context.Context, patch []byte) (S, error) {
	b, err := a.PatchStateJSON(ctx, patch)
	if err != nil {
		var zero S
		return zero, err
	}
	return decodeState[S](b)
}

// ReplaceState replaces the whole state with s. The change is durable
// when ReplaceState returns.
func (a *Actor[S]) ReplaceState(ctx context.Context, s S) error {
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidState, err)
	}
	return a.ReplaceStateJSON(ctx, b)
}

// rawMessage is the type of a class whose state is JSON text.
var rawMessage = reflect.TypeFor[json.RawMessage]()

// decodeState decodes a stored state into a fresh S. A json.RawMessage
// state is the stored bytes themselves, already valid JSON.
func decodeState[S any](b []byte) (S, error) {
	var s S
	if reflect.TypeFor[S]() == rawMessage {
		*any(&s).(*json.RawMessage) = append(json.RawMessage(nil), b...)
		return s, nil
	}
	if err := json.Unmarshal(b, &s); err != nil {
		// Said in JSON's terms: the message reaches HTTP clients and the
		// CLI, who know the state's fields, not its Go type.
		return s, fmt.Errorf("%w: the state does not fit the class's state: %s", ErrInvalidState, jsonerr.Describe(err, "the state"))
	}
	return s, nil
}

func typeName[S any]() string {
	return reflect.TypeFor[S]().String()
}
