"""What the structured-output tests share, engine side and server side: a JSON schema and a
question that asks for it."""

# Every field bounded, so any output the grammar allows ends well within max_tokens.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "mood": {"enum": ["happy", "sad", "calm"]},
        "likes_cats": {"type": "boolean"},
    },
    "required": ["name", "age", "mood", "likes_cats"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe a person as JSON: name, age, mood, likes_cats."}]
