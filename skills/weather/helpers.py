# Weather helpers for code mode (see SKILL.md). Plain functions only: this runs in Monty.
import json

WMO_CODES = {0: "clear sky", 1: "mainly clear", 2: "partly cloudy", 3: "overcast", 45: "fog",
             48: "rime fog", 51: "light drizzle", 53: "drizzle", 55: "dense drizzle",
             56: "freezing drizzle", 57: "freezing drizzle", 61: "light rain", 63: "rain",
             65: "heavy rain", 66: "freezing rain", 67: "freezing rain", 71: "light snow",
             73: "snow", 75: "heavy snow", 77: "snow grains", 80: "light showers", 81: "showers",
             82: "violent showers", 85: "snow showers", 86: "heavy snow showers",
             95: "thunderstorm", 96: "thunderstorm with hail", 99: "thunderstorm with heavy hail"}


def _quote(text):
    """URL-encode a place name (spaces become '+')."""
    safe = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~,"
    out = []
    for ch in text.strip():
        if ch == " ":
            out.append("+")
        elif ch in safe:
            out.append(ch)
        else:
            out.extend(["%" + format(b, "02X") for b in ch.encode("utf-8")])
    return "".join(out)


def _json_body(text):
    """The JSON in a web_fetch result (which starts with a 'URL: ...' header line)."""
    start = text.find("{")
    end = text.rfind("}")
    if start < 0 or end < start:
        raise ValueError("no JSON in the response: " + text[:200])
    return json.loads(text[start:end + 1])


def _num(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _first_value(items):
    """wttr.in wraps strings as [{"value": "..."}]."""
    if items:
        return items[0].get("value", "").strip()
    return ""


def weather_url(place, fmt="j1"):
    """wttr.in URL for a place; fmt 'j1' (JSON), 'j2' (JSON without hourly data) or '3' (one line)."""
    return "https://wttr.in/" + _quote(place) + "?format=" + fmt


def parse_wttr(text):
    """Parse wttr.in ?format=j1/j2 JSON (raw or as returned by web_fetch) into a small dict."""
    data = _json_body(text)
    cur = (data.get("current_condition") or [{}])[0]
    area = (data.get("nearest_area") or [{}])[0]
    request = (data.get("request") or [{}])[0]
    location = ", ".join([x for x in [_first_value(area.get("areaName")), _first_value(area.get("country"))] if x])
    days = []
    for day in data.get("weather") or []:
        hourly = day.get("hourly") or []
        chances = [_num(h.get("chanceofrain")) for h in hourly]
        chances = [c for c in chances if c is not None]
        midday = [h for h in hourly if h.get("time") in ("1200", "1500")]
        desc = _first_value(midday[0].get("weatherDesc")) if midday else ""
        days.append({"date": day.get("date", ""), "min_c": _num(day.get("mintempC")),
                     "max_c": _num(day.get("maxtempC")), "desc": desc,
                     "rain_chance": max(chances) if chances else None,
                     "sun_hours": _num(day.get("sunHour"))})
    return {"location": location or request.get("query", ""),
            "observed": cur.get("localObsDateTime", ""),
            "current": {"temp_c": _num(cur.get("temp_C")), "feels_c": _num(cur.get("FeelsLikeC")),
                        "desc": _first_value(cur.get("weatherDesc")), "humidity": _num(cur.get("humidity")),
                        "wind_kmh": _num(cur.get("windspeedKmph")), "wind_dir": cur.get("winddir16Point", ""),
                        "precip_mm": _num(cur.get("precipMM"))},
            "days": days}


def _deg(value):
    if value is None:
        return "?"
    return str(round(value)) + "°C"


def format_weather(data):
    """A short human summary of parse_wttr / parse_open_meteo output."""
    cur = data["current"]
    lines = [data["location"] + ": " + (cur.get("desc") or "") + ", " + _deg(cur.get("temp_c"))
             + " (feels " + _deg(cur.get("feels_c")) + "), wind " + str(round(cur.get("wind_kmh") or 0)) + " km/h"]
    for day in data["days"]:
        line = day["date"] + ": " + _deg(day["min_c"]) + " to " + _deg(day["max_c"])
        if day.get("desc"):
            line += ", " + day["desc"]
        if day.get("rain_chance") is not None:
            line += ", rain " + str(round(day["rain_chance"])) + "%"
        lines.append(line)
    return "\n".join(lines)


def weather(place):
    """Current weather and a 3-day forecast for a place (needs web_fetch).

    wttr.in first; if it fails or its answer arrives truncated, Open-Meteo.
    """
    try:
        return parse_wttr(web_fetch(weather_url(place, "j1")))
    except Exception as exc:
        print("wttr.in failed (" + " ".join(str(exc).split())[:120] + "), trying Open-Meteo")
    found = _json_body(web_fetch(geocode_url(place))).get("results") or []
    if not found:
        raise ValueError("unknown place: " + place)
    top = found[0]
    name = ", ".join([x for x in [top.get("name", ""), top.get("country", "")] if x])
    return parse_open_meteo(web_fetch(open_meteo_url(top["latitude"], top["longitude"])), name)


def weather_text(place):
    """weather(place) as a short human summary."""
    return format_weather(weather(place))


def geocode_url(name):
    return "https://geocoding-api.open-meteo.com/v1/search?count=1&name=" + _quote(name)


def open_meteo_url(lat, lon, days=3):
    return ("https://api.open-meteo.com/v1/forecast?latitude=" + str(lat) + "&longitude=" + str(lon)
            + "&current=temperature_2m,apparent_temperature,relative_humidity_2m,weather_code,"
            + "wind_speed_10m,precipitation"
            + "&daily=temperature_2m_max,temperature_2m_min,precipitation_probability_max,weather_code"
            + "&timezone=auto&forecast_days=" + str(days))


def wmo_text(code):
    return WMO_CODES.get(int(code), "code " + str(code)) if code is not None else ""


def parse_open_meteo(text, location=""):
    """Parse an Open-Meteo forecast (raw or from web_fetch) into the same shape as parse_wttr."""
    data = _json_body(text)
    cur = data.get("current") or {}
    daily = data.get("daily") or {}
    days = []
    dates = daily.get("time") or []
    for i in range(len(dates)):
        def pick(key):
            values = daily.get(key) or []
            return values[i] if i < len(values) else None
        days.append({"date": dates[i], "min_c": pick("temperature_2m_min"), "max_c": pick("temperature_2m_max"),
                     "desc": wmo_text(pick("weather_code")), "rain_chance": pick("precipitation_probability_max"),
                     "sun_hours": None})
    return {"location": location or (str(data.get("latitude")) + "," + str(data.get("longitude"))),
            "observed": cur.get("time", ""),
            "current": {"temp_c": cur.get("temperature_2m"), "feels_c": cur.get("apparent_temperature"),
                        "desc": wmo_text(cur.get("weather_code")), "humidity": cur.get("relative_humidity_2m"),
                        "wind_kmh": cur.get("wind_speed_10m"), "wind_dir": "", "precip_mm": cur.get("precipitation")},
            "days": days}
