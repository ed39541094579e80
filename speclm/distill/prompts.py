"""Training prompts for drafters: Spec-Bench prompts the benchmark does not use, plus our own."""

from __future__ import annotations

from speclm.data import load_prompts

# The benchmark (speclm.data.load_prompts) takes the first N prompts of each category in file order;
# N is at most this in every committed run, so training starts after them.
BENCHMARK_PER_CATEGORY = 10

# Written for this project: varied chat, coding, math, explanation and list requests.
OWN_PROMPTS = [
    "Hi! How are you doing today?",
    "Can you recommend a good book for a long train ride?",
    "What should I cook for dinner tonight if I only have eggs, rice and spinach?",
    "Tell me a short joke about computers.",
    "I feel nervous before my job interview tomorrow. Any advice?",
    "What is a fun weekend activity for a family with two young kids?",
    "Write a polite email asking my manager for a day off next Friday.",
    "Say something encouraging to a student who failed an exam.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "How do I reverse a list in Python? Show two ways.",
    "Explain what a Python dictionary is, with a short example.",
    "Write a JavaScript function that sums the numbers in an array.",
    "What does the SQL statement SELECT COUNT(*) FROM users WHERE age > 30 do?",
    "Write a bash command that counts the lines in every .txt file in a folder.",
    "What is the difference between a list and a tuple in Python?",
    "What is 17 times 23? Show your steps.",
    "A shirt costs $40 and is on sale for 25% off. What is the sale price?",
    "Solve for x: 3x + 7 = 22.",
    "If a train travels 180 km in 2 hours, what is its average speed?",
    "What is the sum of the first 10 positive integers?",
    "Tom has 12 apples and gives a third of them to Anna. How many does he have left?",
    "Is 91 a prime number? Explain.",
    "What is the area of a circle with radius 3 cm?",
    "Explain photosynthesis in simple terms.",
    "Why is the sky blue?",
    "How does a refrigerator keep food cold?",
    "Explain what inflation is to a teenager.",
    "What causes the seasons on Earth?",
    "How do vaccines help the immune system?",
    "Explain the difference between weather and climate.",
    "What is machine learning, in two or three sentences?",
    "List five tips for getting better sleep.",
    "List the planets of the solar system in order from the Sun.",
    "Give me a list of five healthy snacks.",
    "List four ways to save money on groceries.",
    "What are three benefits of regular exercise?",
    "Name five famous painters and one work by each.",
    "List the steps to make a cup of tea.",
    "Give three ideas for a birthday gift for a friend who likes hiking.",
    "Write a haiku about autumn leaves.",
    "Summarize the story of Cinderella in three sentences.",
]


# More training data without a network: every template applied to every topic (the first drafters,
# trained on ~190 prompts only, agreed with the target on 80-90% of training tokens but only 14-24%
# of held-out ones: they memorised; 431 prompts still left EAGLE at 51-73% on training prompts vs
# 30-50% held out, hence 14 templates x 64 topics now).
TOPICS = [
    "black holes",
    "the French Revolution",
    "climate change",
    "the human heart",
    "volcanoes",
    "the stock market",
    "renewable energy",
    "the Roman Empire",
    "honey bees",
    "artificial intelligence",
    "the water cycle",
    "the printing press",
    "electric cars",
    "the immune system",
    "coral reefs",
    "the Industrial Revolution",
    "quantum computing",
    "the Moon landing",
    "recycling",
    "the Great Wall of China",
    "jazz music",
    "the internet",
    "earthquakes",
    "the Olympic Games",
    "chess",
    "coffee",
    "the Amazon rainforest",
    "vaccines",
    "democracy",
    "the Renaissance",
    "sleep",
    "social media",
    "the periodic table",
    "dinosaurs",
    "cryptography",
    "remote work",
    "the ocean tides",
    "bread baking",
    "public transport",
    "the Silk Road",
    "photosynthesis",
    "video games",
    "urban gardening",
    "the theory of evolution",
    "solar panels",
    "the Mars rovers",
    "languages and dialects",
    "friendship",
    "rainbows",
    "small businesses",
    "marathon running",
    "the metric system",
    "penguins",
    "3D printing",
    "the Egyptian pyramids",
    "wind turbines",
    "meditation",
    "the history of money",
    "glaciers",
    "a city library",
    "mushrooms",
    "the human brain",
    "container shipping",
    "board games",
]
TEMPLATES = [
    "Explain {} to a beginner.",
    "Write a short essay about {}.",
    "What are the main advantages and disadvantages of {}?",
    "Give me five interesting facts about {}.",
    "Summarize the history of {} in a few paragraphs.",
    "Write a short story in which {} plays an important role.",
    "How does {} work? Answer step by step.",
    "What are three common misconceptions about {}?",
    "Write a short poem about {}.",
    "Create a quiz with three questions and answers about {}.",
    "Describe {} to a ten-year-old.",
    "What might the future of {} look like?",
    "Write a blog post introduction about {}.",
    "List the key terms someone should know about {}, with one-line definitions.",
]
TOPIC_PROMPTS = [template.format(topic) for topic in TOPICS for template in TEMPLATES]


def split_specbench(path: str, benchmark_per_category: int = BENCHMARK_PER_CATEGORY) -> tuple[list[str], list[str]]:
    """(benchmark prompts, training prompts): the benchmark's own selection (speclm.data.load_prompts,
    the first `benchmark_per_category` first turns of each category in file order), and the rest."""
    bench = load_prompts(path, per_category=benchmark_per_category)
    bench_ids = {p["id"] for p in bench}
    train = [p["text"] for p in load_prompts(path) if p["id"] not in bench_ids]
    return [p["text"] for p in bench], train


def training_prompts(
    specbench_path: str | None, benchmark_per_category: int = BENCHMARK_PER_CATEGORY, own: bool = True
) -> list[str]:
    """Spec-Bench prompts outside the benchmark split, then (with own=True) OWN_PROMPTS and TOPIC_PROMPTS."""
    train = split_specbench(specbench_path, benchmark_per_category)[1] if specbench_path else []
    return train + (list(OWN_PROMPTS) + TOPIC_PROMPTS if own else [])
